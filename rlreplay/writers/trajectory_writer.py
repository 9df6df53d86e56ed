"""The low-level writer: one stream of steps in, items over its most recent steps out."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.core.table import Table
from rlreplay.errors import ClosedError, InvalidArgumentError, describe


class TrajectoryWriter:
    """Appends one stream's steps to the tables' shared store and creates items over them.

    Items never cross an episode boundary: after :meth:`end_episode` only steps appended
    since can be used. The writer keeps the ids of the last ``history`` steps of the current
    episode; an item may start at any of them.

    Several writers may append to one store from different threads. Items must be
    contiguous in the store, so when another stream's steps were appended in between, the
    writer first re-appends the retained steps of its current episode (at most
    ``history - 1`` of them) and continues from the copies. One writer per store, or
    writers that append in chunks (:meth:`append_batch`), keep this overhead small.

    The local writer stores each step immediately, so :meth:`flush` has nothing to wait
    for; it exists so that code written against it also runs against a network writer.

    Args:
        tables: the tables items will be created in; they must share one store.
        history: steps an item may reach back (default: the longest item span).

    Raises:
        InvalidArgumentError: if the tables do not share one store or ``history`` is bad.

    Example:
        >>> with TrajectoryWriter(table) as writer:                        # doctest: +SKIP
        ...     writer.append({"obs": obs, "action": a, "reward": r})
        ...     writer.create_item(table, priority=1.0)
        ...     writer.end_episode()
    """

    def __init__(self, tables: Table | Sequence[Table], *, history: int | None = None):
        tables = [tables] if isinstance(tables, Table) else list(tables)
        if not tables:
            raise InvalidArgumentError("tables is empty; give at least one Table")
        store = tables[0].store
        if any(t.store is not store for t in tables):
            raise InvalidArgumentError(
                f"tables {[t.name for t in tables]} do not share one StepStore; a writer "
                "appends to one store"
            )
        if store.lanes != 1:
            raise InvalidArgumentError(
                f"the store has lanes={store.lanes}; TrajectoryWriter writes one stream, use "
                "a vector-env adder for lockstep lanes"
            )
        longest = max(t.layout.span for t in tables)
        history = longest if history is None else history
        if not isinstance(history, int) or history < longest or history > store.capacity:
            raise InvalidArgumentError(
                f"history={describe(history)} must be an int in [{longest} (the longest item "
                f"span), {store.capacity} (the store capacity)]"
            )
        self.tables = tables
        self.store = store
        self.history = history
        self._ids: deque[int] = deque(maxlen=history)
        self._closed = False
        self.copied_steps = 0  # steps re-appended because another stream interleaved

    @property
    def episode_step_ids(self) -> list[int]:
        """Store ids of the retained steps of the current episode, oldest first."""
        return list(self._ids)

    def append(self, step: Mapping[str, Any], *, timeout: float | None = None) -> int:
        """Append one step (a dict with one value per signature field); returns its id.

        Raises:
            SignatureError: if the step does not match the store's signature.
            ReplayTimeoutError: if a queue table kept the store from overwriting for
                ``timeout`` seconds.
        """
        row = self.store.signature.check_row(step, "step")
        return self._append(row, None, timeout)

    def append_batch(self, steps: Mapping[str, Any], *, timeout: float | None = None) -> int:
        """Append consecutive steps of this stream (each field ``[n, ...]``); returns the
        first id."""
        arrays, n = self.store.signature.check_batch(steps, "steps")
        if n < 1 or n > self.store.capacity:
            raise InvalidArgumentError(
                f"steps hold {n} steps; append between 1 and {self.store.capacity}"
            )
        return self._append(arrays, n, timeout)

    def _append(self, arrays: dict, n: int | None, timeout: float | None) -> int:
        """Append ``n`` steps (``None``: one step without a batch axis) after this
        stream's previous step, copying its context first if another stream came between."""
        if self._closed:
            raise ClosedError("the writer is closed")
        store = self.store
        with store.mutex:
            if self._ids and self._ids[-1] != store.next_id - 1:
                self._reappend_context(timeout)
            if n is None:
                first = store._append_one_locked(arrays, timeout)
                self._ids.append(first)
            else:
                first = store._append_locked(arrays, n, timeout)
                self._ids.extend(range(first, first + n))
        return first

    def _reappend_context(self, timeout: float | None) -> None:
        """Copy the retained steps of this episode to the end of the store (lock held)."""
        keep = [i for i in list(self._ids)[-(self.history - 1) :] if self.store.is_stored(i)]
        if self.history == 1 or not keep:
            self._ids.clear()
            return
        data = self.store.read(np.array(keep))
        first = self.store._append_locked(data, len(keep), timeout)
        self._ids.clear()
        self._ids.extend(range(first, first + len(keep)))
        self.copied_steps += len(keep)

    def create_item(
        self,
        table: Table | str,
        priority: float | None = None,
        *,
        start: int | None = None,
        length: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Create an item in ``table`` over this stream's recent steps; returns its key.

        Args:
            table: one of the writer's tables, or its name.
            priority: the item's priority (``None``: the table's default).
            start: the item's first step as a negative index into this episode's steps
                (``-1`` is the latest); default ``-length``, so the item ends at the
                latest step.
            length: steps the item covers, for tables whose layout has per-item extents
                (``from_end``/``pad`` windows); default ``table.layout.span``.
            timeout: seconds to wait for the table's rate limiter.

        Raises:
            InvalidArgumentError: if the table is not the writer's, or the episode has too
                few steps for the item (it would cross the episode start).
            RateLimiterTimeoutError: if the limiter blocked the insert for ``timeout``.
        """
        if self._closed:
            raise ClosedError("the writer is closed")
        table = self._table(table)
        span = table.layout.span if length is None else length
        start = -span if start is None else start
        if not isinstance(start, int) or start >= 0 or -start > len(self._ids):
            raise InvalidArgumentError(
                f"start={describe(start)} must be a negative int with |start| <= "
                f"{len(self._ids)} (the retained steps of this episode)"
            )
        if start + span > 0:
            raise InvalidArgumentError(
                f"an item starting at start={start} spans {span} steps and would need "
                f"{start + span} step(s) not appended yet"
            )
        anchor = self._ids[len(self._ids) + start]
        return table.create_item(anchor, priority, length=length, timeout=timeout)

    def create_items(
        self,
        table: Table | str,
        priorities: Any = None,
        *,
        starts: Any,
        lengths: Any = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Batch form of :meth:`create_item`: one item per entry of ``starts``.

        Args:
            table: one of the writer's tables, or its name.
            priorities: one priority per item, one for all, or ``None`` (default).
            starts: negative indexes into this episode's retained steps, as ``start``.
            lengths: per-item lengths (``None``: the layout's span for every item).
            timeout: seconds to wait for the table's rate limiter.

        Returns:
            int64 keys of the new items.

        Raises:
            InvalidArgumentError: as :meth:`create_item`; no item is created then.
            RateLimiterTimeoutError: if the limiter blocked the insert for ``timeout``.
        """
        if self._closed:
            raise ClosedError("the writer is closed")
        table = self._table(table)
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        span = table.layout.span if lengths is None else np.asarray(lengths, dtype=np.int64)
        held = len(self._ids)
        if len(starts) and (starts.max() >= 0 or -starts.min() > held or (starts + span).max() > 0):
            raise InvalidArgumentError(
                f"starts={describe(starts.tolist())} must be negative, reach back at most "
                f"{held} retained steps, and cover only steps already appended"
            )
        if len(starts) == 0:
            return np.zeros(0, dtype=np.int64)
        first = self._ids[0]
        anchors = first + held + starts  # retained ids are consecutive
        return table.create_items(anchors, priorities, lengths=lengths, timeout=timeout)

    def _table(self, table: Table | str) -> Table:
        for t in self.tables:
            if t is table or t.name == table:
                return t
        raise InvalidArgumentError(
            f"table {getattr(table, 'name', table)!r} is not one of this writer's tables "
            f"{[t.name for t in self.tables]}"
        )

    def end_episode(self) -> None:
        """End the current episode: later items cannot reach the steps before this call."""
        self._ids.clear()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything appended is stored (always already true locally)."""
        if self._closed:
            raise ClosedError("the writer is closed")

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
