"""A remote writer's argument and item checks, made when an item is created (as
:class:`rlreplay.TrajectoryWriter` does), not when the server makes it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlreplay.core.rate_limiters import insert_pack
from rlreplay.core.table_checks import int_array
from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.net.client.writer.chunks import MAX_IN_FLIGHT
from rlreplay.writers.trajectory_writer import too_few_steps

_INF = float("inf")

Item = tuple[int, int, float, int]  # table index, anchor (stream index), priority, length


def check_writer_args(
    client: Any, tables: Any, history: Any, chunk_steps: Any, max_in_flight: Any
) -> tuple[list[str], list[int], list[bool], int, int, int]:
    """Check a remote writer's arguments against its tables on the server.

    Returns:
        Table names, item spans, per-item-length flags, ``history``, ``chunk_steps`` and the
        most items one chunk may hold (see :func:`~rlreplay.core.rate_limiters.insert_pack`).

    Raises:
        InvalidArgumentError: as for
            :class:`~rlreplay.net.client.writer.remote_writer.RemoteTrajectoryWriter`.
    """
    names = [tables] if isinstance(tables, str) else [getattr(t, "name", t) for t in tables]
    if not names:
        raise InvalidArgumentError("tables is empty; give at least one table name")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"tables {names} name a table twice; give each table once")
    descs = [client.describe(n) for n in names]
    if any(d["store"] != descs[0]["store"] for d in descs):
        raise InvalidArgumentError(
            f"tables {names} do not share one step store; a writer appends to one store"
        )
    if descs[0]["lanes"] != 1:
        raise InvalidArgumentError("the tables' store has lanes > 1; use a vector adder")
    capacity = descs[0]["store_capacity"]
    spans = [int(d["span"]) for d in descs]
    longest = max(spans)
    history = longest if history is None else history
    if not isinstance(history, int) or not longest <= history <= capacity:
        raise InvalidArgumentError(
            f"history={describe(history)} must be an int in [{longest} (the longest item "
            f"span), {capacity} (the store capacity)]"
        )
    if chunk_steps is None:
        chunk_steps = max(1, min(1024, capacity - history))
    if not isinstance(chunk_steps, int) or not 1 <= chunk_steps <= capacity - history:
        raise InvalidArgumentError(
            f"chunk_steps={describe(chunk_steps)} must be an int in [1, "
            f"{capacity - history}] (store capacity minus history)"
        )
    if not isinstance(max_in_flight, int) or not 1 <= max_in_flight <= MAX_IN_FLIGHT:
        raise InvalidArgumentError(
            f"max_in_flight={describe(max_in_flight)} must be an int in [1, {MAX_IN_FLIGHT}]"
        )
    # a chunk holds at most a table's max_size items and half what its limiter admits
    limits = [int(d["max_size"]) for d in descs]
    limits += [
        int(insert_pack(d["insert_window"])) for d in descs if d.get("insert_window") is not None
    ]
    variable = [bool(client.table(n).layout.variable) for n in names]
    return names, spans, variable, history, chunk_steps, min(limits)


def _per_item(values: Any, n: int, name: str) -> list:
    """``values`` (one per item, one for all, or ``None``) as a list of ``n``."""
    if values is None:
        return [None] * n
    try:
        return np.broadcast_to(values, (n,)).tolist()
    except ValueError:
        raise InvalidArgumentError(
            f"{name}={describe(values)} must be one value, or one per item of the {n} starts"
        ) from None


class PendingItems:
    """The items of the next chunk, and the anchors each table has used lately.

    Args:
        names: the writer's tables, in the order chunks index them.
        spans: each table's item span.
        variable: whether each table takes per-item lengths.
        history: steps an item may reach back.
        max_items: the most items one chunk may hold (the tables' smallest insert window).
    """

    def __init__(
        self, names: list[str], spans: list[int], variable: list[bool], history: int,
        max_items: int,
    ):
        self.names = names
        self.spans = spans
        self.variable = variable
        self.history = history
        self.max_items = max_items
        self.items: list[Item] = []
        self._index = {n: i for i, n in enumerate(names)}
        self._anchors: list[set[int]] = [set() for _ in names]
        self._top_anchor = [-1] * len(names)
        self._prune_at = max(1024, 4 * history)

    @property
    def full(self) -> bool:
        """Whether the next chunk holds as many items as it may."""
        return len(self.items) >= self.max_items

    @property
    def over(self) -> bool:
        """Whether more items are buffered than one chunk may hold."""
        return len(self.items) > self.max_items

    def add_latest(self, table: Any, priority: Any, stream: int, episode_start: int) -> bool:
        """Fast path for an item ending at the latest step; False if not that case."""
        t = self._index.get(table)
        if t is None:
            return False
        anchor = stream - self.spans[t]
        if (
            anchor >= episode_start
            and anchor > self._top_anchor[t]
            and (priority is None or (priority.__class__ is float and 0 <= priority < _INF))
        ):
            self._top_anchor[t] = anchor
            seen = self._anchors[t]
            seen.add(anchor)
            if len(seen) > self._prune_at:
                self._anchors[t] = {a for a in seen if a >= stream - self.history}
            self.items.append((t, anchor, math.nan if priority is None else priority, -1))
            return True
        return False

    def add(
        self,
        table: Any,
        priority: Any,
        start: int | None,
        length: int | None,
        stream: int,
        episode_start: int,
    ) -> None:
        """Check and buffer one item (InvalidArgumentError as :meth:`check`: nothing added)."""
        t, anchor, priority = self.check(table, priority, start, length, stream, episode_start)
        self._top_anchor[t] = max(self._top_anchor[t], anchor)
        seen = self._anchors[t]
        seen.add(anchor)
        if len(seen) > self._prune_at:
            low = stream - self.history
            self._anchors[t] = {a for a in seen if a >= low}
        self.items.append((t, anchor, priority, -1 if length is None else length))

    def check(
        self,
        table: Any,
        priority: Any,
        start: int | None,
        length: int | None,
        stream: int,
        episode_start: int,
    ) -> tuple[int, int, float]:
        """The table's index, the anchor and the priority (NaN: default) of an item
        :meth:`add` would buffer; changes nothing.

        Raises:
            InvalidArgumentError: for an unknown table, a bad ``start``, ``length`` or
                priority, or a second item at one anchor of a table.
        """
        t = self._index.get(table)
        if t is None:
            t = self._index.get(getattr(table, "name", None))
            if t is None:
                raise InvalidArgumentError(
                    f"table {getattr(table, 'name', table)!r} is not one of this writer's "
                    f"tables {self.names}"
                )
        span = self.spans[t]
        if length is not None:
            if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= span:
                raise InvalidArgumentError(
                    f"length={describe(length)} must be an int in [1, {span}] (the steps the "
                    f"items of table {self.names[t]!r} span)"
                )
            if not self.variable[t]:
                raise InvalidArgumentError(
                    f"length={length} was given but table {self.names[t]!r} has a fixed-span "
                    "layout; per-item lengths need from_end or pad windows"
                )
            span = length
        retained = min(self.history, stream - episode_start)
        if start is None:
            start = -span
            if span > retained:
                raise too_few_steps(self.names[t], span, retained)
        elif (
            not isinstance(start, (int, np.integer)) or isinstance(start, bool) or start >= 0
        ):
            raise InvalidArgumentError(f"start={describe(start)} must be a negative int")
        start = int(start)
        if -start > retained:
            raise InvalidArgumentError(
                f"start={start} must satisfy |start| <= {retained} (the retained steps of "
                "this episode)"
            )
        if start + span > 0:
            raise InvalidArgumentError(
                f"an item starting at start={start} spans {span} steps and would need "
                f"{start + span} step(s) not appended yet"
            )
        if priority is None:
            priority = math.nan
        else:
            if isinstance(priority, bool) or not isinstance(priority, (int, float, np.number)):
                raise InvalidArgumentError(
                    f"priority={describe(priority)} must be a number >= 0, or None for the "
                    "table's default"
                )
            priority = float(priority)
            if not (math.isfinite(priority) and priority >= 0):
                raise InvalidArgumentError(
                    f"priority={priority} must be finite and >= 0 (e.g. abs(td_error) + 1e-6)"
                )
        anchor = stream + start
        if anchor <= self._top_anchor[t] and anchor in self._anchors[t]:
            raise InvalidArgumentError(
                f"table {self.names[t]!r} already gets an item anchored at that step; "
                "a table holds at most one item per anchor step"
            )
        return t, anchor, priority

    def check_all(self, *item_args: Any) -> None:
        """Raise as :meth:`add_all` would for these arguments, changing nothing."""
        before, tops = len(self.items), list(self._top_anchor)
        anchors = [set(a) for a in self._anchors]
        self.add_all(*item_args)
        del self.items[before:]
        self._top_anchor, self._anchors = tops, anchors

    def add_all(
        self,
        table: Any,
        priorities: Any,
        starts: Any,
        lengths: Any,
        stream: int,
        episode_start: int,
    ) -> None:
        """Check and buffer one item per entry of ``starts``, all or none.

        Raises:
            InvalidArgumentError: as :meth:`add`, or ``priorities``/``lengths`` not matching.
        """
        starts = int_array(starts, "starts").tolist()
        prios = _per_item(priorities, len(starts), "priorities")
        lens = _per_item(lengths, len(starts), "lengths")
        before, tops = len(self.items), list(self._top_anchor)
        try:
            for start, priority, length in zip(starts, prios, lens):
                self.add(table, priority, start, length, stream, episode_start)
        except InvalidArgumentError:
            # these anchors were new to their table
            for t, anchor, _, _ in self.items[before:]:
                self._anchors[t].discard(anchor)
            del self.items[before:]
            self._top_anchor = tops
            raise

    def next_items(self) -> list[Item]:
        """The items :meth:`take` takes next."""
        return self.items[: self.max_items]

    def take(self) -> list[Item]:
        """Take the buffered items for one chunk (at most ``max_items``, oldest first)."""
        if len(self.items) <= self.max_items:
            items, self.items = self.items, []
            return items
        items = self.items[: self.max_items]
        del self.items[: self.max_items]
        return items

    def end_episode(self, stream: int) -> None:
        """An episode ended before stream index ``stream``: later items anchor after it."""
        for seen in self._anchors:
            seen.clear()
        self._top_anchor = [stream - 1] * len(self._anchors)

    def drop_before(self, end: int) -> int:
        """Remove buffered items anchored before ``end``; returns how many."""
        before = len(self.items)
        self.items = [it for it in self.items if it[1] >= end]
        return before - len(self.items)
