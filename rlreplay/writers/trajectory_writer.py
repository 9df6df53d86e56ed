"""The low-level writer: one stream of steps in, items over its most recent steps out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.core.table import Table
from rlreplay.core.table_checks import int_array
from rlreplay.errors import ClosedError, InvalidArgumentError, check_count, check_timeout, describe


def too_few_steps(table: str, needed: int, has: int) -> InvalidArgumentError:
    """The error of ``create_item`` without ``start`` when the episode has too few steps.

    Args:
        table: the table's name.
        needed: steps the item covers.
        has: steps of this episode the writer retains.
    """
    more = needed - has
    when = "after the next append" if more == 1 else f"after {more} more appends"
    return InvalidArgumentError(
        f"an item of table {table!r} needs {needed} steps of this episode; it has {has} "
        f"(call create_item {when})"
    )


class TrajectoryWriter:
    """Appends one stream's steps to the tables' shared store and creates items over them.

    The writer retains the last ``history`` steps of its episode; items start at any of them
    and never cross :meth:`end_episode`. Several writers may append to one store from
    different threads: retained steps stay protected (:mod:`rlreplay.core.overwrite`).
    :meth:`flush` has nothing to wait for locally (kept for network writers).

    Args:
        tables: the tables items will be created in; they must share one store.
        history: steps an item may reach back (default: the longest item span).

    Raises:
        InvalidArgumentError: if the tables do not share one store, a table is given twice,
            or ``history`` is bad.

    Example:
        >>> with TrajectoryWriter(table) as writer:                        # doctest: +SKIP
        ...     writer.append({"obs": obs, "action": a, "reward": r})
        ...     writer.create_item(table, priority=1.0)
        ...     writer.end_episode()
    """

    def __init__(self, tables: Table | Sequence[Table], *, history: int | None = None):
        if isinstance(tables, Table):
            tables = [tables]
        elif isinstance(tables, (list, tuple)) and all(isinstance(t, Table) for t in tables):
            tables = list(tables)
        else:
            raise InvalidArgumentError(
                f"tables={describe(tables)} must be a Table or a list of Tables sharing one "
                "StepStore"
            )
        if not tables:
            raise InvalidArgumentError("tables is empty; give at least one Table")
        if len({id(t) for t in tables}) != len(tables):
            raise InvalidArgumentError(
                f"tables {[t.name for t in tables]} name a table twice; give each table once"
            )
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
        self.signature = store.signature
        self.history = history
        with store.mutex:
            # Retained steps, moved only by the store's overwrite protocol.
            self._retention = store.overwrite.retain(history)
        self._closed = False
        self.copied_steps = 0  # steps re-appended because another stream interleaved

    @property
    def episode_step_ids(self) -> list[int]:
        """Store ids of the retained steps of the current episode, oldest first."""
        with self.store.mutex:
            r = self._retention
            return list(range(r.first, r.end))

    def append(self, step: Mapping[str, Any], *, timeout: float | None = None) -> int:
        """Append one step (one value per signature field); returns its id.

        Raises:
            SignatureError: if the step does not match the store's signature.
            InvalidArgumentError: if the store cannot hold every writer's retained steps plus it.
            ReplayTimeoutError: if a queue table kept the store from overwriting for ``timeout``.
            ClosedError: if the writer is, or gets, closed.
        """
        timeout = check_timeout(timeout)
        row = self.store.signature.check_row(step, "step")
        return self._append(row, None, timeout)

    def append_batch(self, steps: Mapping[str, Any], *, timeout: float | None = None) -> int:
        """Append consecutive steps (each field ``[n, ...]``); returns the first id. Raises as
        :meth:`append`, and InvalidArgumentError for ``n`` outside ``[1, capacity]``."""
        timeout = check_timeout(timeout)
        arrays, n = self.store.signature.check_batch(steps, "steps")
        if n < 1 or n > self.store.capacity:
            raise InvalidArgumentError(
                f"steps hold {n} steps; append between 1 and {self.store.capacity}"
            )
        return self._append(arrays, n, timeout)

    def _append(self, arrays: dict, n: int | None, timeout: float | None) -> int:
        """Append ``n`` steps (``None``: one, unbatched) after the retained; returns first id."""
        if self._closed:
            raise ClosedError("the writer is closed")
        store = self.store
        count = 1 if n is None else n
        r = self._retention
        with store.mutex:
            waiter = None
            while True:
                if self._closed:
                    raise ClosedError("the writer was closed while its append waited")
                keep = 0 if count >= r.limit else min(r.count, r.limit - count)
                away = keep and r.first + r.count != store.next_id
                if store.overwrite.make_room(count, r, keep) is not None:
                    break
                waiter = waiter or store.blocked_call(timeout, "append")
                if not waiter.wait():
                    raise store.timeout_error(count, timeout)
            if away:
                self.copied_steps += keep
            first = store.write(arrays, count, one_row=n is None)
            r.extend(first, count)
        return first

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
            start: the first step as a negative index into this episode (``-1``: the latest);
                default ``-length``, ending at the latest step.
            length: steps the item covers, only for layouts with per-item extents
                (``from_end``/``pad`` windows; InvalidArgumentError otherwise); default the span.
            timeout: seconds to wait for the table's rate limiter.

        Raises:
            InvalidArgumentError: if the table is not the writer's, or the item would cross the
                episode start.
            RateLimiterTimeoutError: if the limiter blocked the insert for ``timeout``.
        """
        if self._closed:
            raise ClosedError("the writer is closed")
        timeout = check_timeout(timeout)
        table = self._table(table)
        if length is not None:
            length = check_count(length, "length", f"steps, at most {table.layout.span}")
            if length > table.layout.span:
                raise InvalidArgumentError(
                    f"length={length} is more than the {table.layout.span} steps the items of "
                    f"table {table.name!r} span; give at most {table.layout.span}"
                )
        span = table.layout.span if length is None else length
        defaulted = start is None
        if not defaulted and isinstance(start, np.integer):
            start = int(start)
        start = -span if defaulted else start
        if not isinstance(start, int) or isinstance(start, bool) or start >= 0:
            raise InvalidArgumentError(
                f"start={describe(start)} must be a negative int (-1 is the latest step)"
            )
        if start + span > 0:
            raise InvalidArgumentError(
                f"an item starting at start={start} spans {span} steps and would need "
                f"{start + span} step(s) not appended yet"
            )
        with self.store.mutex:
            held = self._retention.count
            if -start > held and defaulted:
                raise too_few_steps(table.name, span, held)
            if -start > held:
                raise InvalidArgumentError(
                    f"start={start} reaches back {-start} steps but this episode retains "
                    f"{held}; |start| must be <= {held}"
                )
            self._admit(
                table, 1, timeout, priority, None if length is None else (length,),
                (self._retention.end + start,),
            )
            # Anchored after the limiter admitted the item: the steps cannot move between.
            anchor = self._retention.end + start
            return table.create_item(anchor, priority, length=length, timeout=timeout)

    def _admit(
        self,
        table: Table,
        n: int,
        timeout: float | None,
        priorities: Any,
        lengths: Any,
        anchors: Any,
    ) -> None:
        """Wait (store lock held) until ``table``'s limiter admits ``n`` items, checked first.

        Raises:
            InvalidArgumentError: for a bad priority or length.
            DeadlockError: for ``n`` items the limiter could never admit at once.
        """
        if table.admission.can_insert(n, 0):
            return
        table.check_items(n, priorities, lengths, anchors)
        table.rate_limiter.check_insert_batch(n)
        waiter = table.admission.admit(n, None, timeout)
        if waiter is not None:
            waiter.settle()

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
        timeout = check_timeout(timeout)
        table = self._table(table)
        starts = int_array(starts, "starts")
        if len(starts) == 0:
            return np.zeros(0, dtype=np.int64)
        _, extents = table.check_items(len(starts), None, lengths)
        span = table.layout.span if extents is None else extents
        if starts.max() >= 0 or (starts + span).max() > 0:
            raise InvalidArgumentError(
                f"starts={describe(starts.tolist())} must be negative and cover only steps "
                "already appended"
            )
        with self.store.mutex:
            held = self._retention.count
            if -starts.min() > held:
                raise InvalidArgumentError(
                    f"starts={describe(starts.tolist())} reach back more than the {held} "
                    "retained steps of this episode"
                )
            if len(starts) <= table.max_size:
                anchors = self._retention.end + starts
                self._admit(table, len(starts), timeout, priorities, lengths, anchors)
            anchors = self._retention.end + starts  # retained ids are consecutive
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
        """End the current episode: later items cannot reach its steps, which may be overwritten.

        Raises:
            ClosedError: after :meth:`close`.
        """
        if self._closed:
            raise ClosedError("the writer is closed")
        with self.store.mutex:
            self._retention.release()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything appended is stored (always already true locally).

        Raises:
            InvalidArgumentError: for a ``timeout`` that is not a number > 0 or None.
            ClosedError: after :meth:`close`.
        """
        if self._closed:
            raise ClosedError("the writer is closed")
        check_timeout(timeout)

    def close(self) -> None:
        """Release the retained steps; later calls raise :class:`ClosedError`."""
        with self.store.mutex:
            if not self._closed:
                self._closed = True
                self.store.overwrite.forget(self._retention)

    def __enter__(self) -> TrajectoryWriter:
        if self._closed:
            raise ClosedError("the writer is closed; create a new one")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
