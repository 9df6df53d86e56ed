"""The items a remote writer has created and not yet sent, checked as a local writer
checks them.

A :class:`~rlreplay.net.writer.RemoteTrajectoryWriter` creates items on the server when
their chunk arrives, so it must refuse a bad item when it is created, as
:class:`rlreplay.TrajectoryWriter` does: an unknown table, a ``start`` outside the retained
steps of the episode, an item needing steps not appended yet, a second item at one anchor
of a table, a bad priority. :class:`PendingItems` holds those checks and the state they
need (per table, the anchors used over the recent steps), and the items buffered for the
next chunk.
"""

from __future__ import annotations

import math
from typing import Any

from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.writers.trajectory_writer import too_few_steps

_INF = float("inf")

Item = tuple[int, int, float, int]  # table index, anchor (stream index), priority, length


class PendingItems:
    """The items of the next chunk, and the anchors each table has used lately.

    Args:
        names: the writer's tables, in the order chunks index them.
        spans: each table's item span.
        history: steps an item may reach back.
        max_items: the most items one chunk may hold (the tables' smallest insert window).
    """

    def __init__(self, names: list[str], spans: list[int], history: int, max_items: int):
        self.names = names
        self.spans = spans
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

    def add_latest(self, table: Any, priority: Any, stream: int, episode_start: int) -> bool:
        """The common case, fast: an item of ``table`` ending at the latest step, anchors
        growing, priority ``None`` or a float. Returns False (nothing added) when the item
        is not that case; :meth:`add` then checks it in full."""
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
        """Check and buffer one item (arguments as
        :meth:`~rlreplay.net.writer.RemoteTrajectoryWriter.create_item`), given the stream
        index of the next step and where the episode began.

        Raises:
            InvalidArgumentError: for an unknown table, a bad ``start``, ``length`` or
                priority, or a second item at one anchor of a table; nothing is added.
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
            if not isinstance(length, int) or not 1 <= length <= self.history:
                raise InvalidArgumentError(
                    f"length={describe(length)} must be an int in [1, history={self.history}]"
                )
            span = length
        retained = min(self.history, stream - episode_start)
        if start is None:
            start = -span
            if span > retained:
                raise too_few_steps(self.names[t], span, retained)
        elif not isinstance(start, int) or start >= 0:
            raise InvalidArgumentError(f"start={describe(start)} must be a negative int")
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
        self._top_anchor[t] = max(self._top_anchor[t], anchor)
        seen = self._anchors[t]
        seen.add(anchor)
        if len(seen) > self._prune_at:
            low = stream - self.history
            self._anchors[t] = {a for a in seen if a >= low}
        self.items.append((t, anchor, priority, -1 if length is None else length))

    def take(self) -> list[Item]:
        """The buffered items, for a chunk; the buffer is empty afterwards."""
        items, self.items = self.items, []
        return items

    def end_episode(self, stream: int) -> None:
        """An episode ended before stream index ``stream``: later items anchor after it."""
        for seen in self._anchors:
            seen.clear()
        self._top_anchor = [stream - 1] * len(self._anchors)

    def drop_before(self, end: int) -> int:
        """Remove the buffered items anchored before stream index ``end`` (their steps
        were dropped); returns how many were removed."""
        before = len(self.items)
        self.items = [it for it in self.items if it[1] >= end]
        return before - len(self.items)
