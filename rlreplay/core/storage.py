"""The step store: columnar ring storage shared by one or more tables.

Each field of the signature is one preallocated numpy array of ``capacity`` rows. Every
appended step gets a monotonically increasing step id; it lives in row ``id % capacity``
until ``capacity`` newer steps overwrite it. Tables never copy step data: their items
are windows (anchor row plus per-field offsets) over these arrays.

With ``lanes > 1`` the store holds ``lanes`` interleaved streams advancing in lockstep
(one step per lane per append), as a vector environment produces them: step ``k`` of lane
``i`` has id ``k * lanes + i``, so consecutive steps of one lane are ``lanes`` ids apart and
an item's window uses that stride.

Before rows are overwritten, every attached table is told (:meth:`StepStore.append`
calls ``table._on_overwrite(rows)``) so it removes the items anchored there first: no
item is ever served with overwritten data. All mutation happens under ``store.mutex``,
which every table over the store shares (``store.lock`` is the condition over it that
blocked calls wait on).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.core._compiled import load_kernel
from rlreplay.core.specs import Signature
from rlreplay.errors import InvalidArgumentError, ReplayTimeoutError, describe

if TYPE_CHECKING:
    from rlreplay.core.table import Table

_kernel = load_kernel("rlreplay.core._store")


class StepStore:
    """Columnar ring of steps.

    Args:
        signature: field specs of one step (nested dicts allowed).
        capacity: number of steps kept; older steps are overwritten.
        lanes: number of lockstep streams (1 for a plain stream).

    Raises:
        InvalidArgumentError: if ``capacity`` is not a positive multiple of ``lanes``.

    Example:
        >>> store = StepStore({"obs": ((4,), "float32")}, capacity=8)
        >>> store.append({"obs": np.ones((3, 4))})
        0
        >>> store.num_steps
        3
    """

    def __init__(self, signature: Mapping[str, Any] | Signature, capacity: int, lanes: int = 1):
        self.signature = Signature(signature)
        if not isinstance(lanes, (int, np.integer)) or lanes < 1 or lanes > 65535:
            raise InvalidArgumentError(f"lanes={describe(lanes)} must be an int in [1, 65535]")
        if (
            not isinstance(capacity, (int, np.integer))
            or capacity < 1
            or capacity % lanes
            or capacity >= 2**31
        ):
            raise InvalidArgumentError(
                f"capacity={describe(capacity)} must be a positive int below 2**31 and a "
                f"multiple of lanes={lanes}"
            )
        self.capacity = int(capacity)
        self.lanes = int(lanes)
        self.columns: dict[str, np.ndarray] = {
            path: np.zeros((self.capacity, *spec.shape), dtype=spec.dtype)
            for path, spec in self.signature.fields.items()
        }
        self.next_id = 0
        # Every mutation holds ``mutex``; blocked calls wait on ``lock``, a condition over
        # it. Entering the mutex itself costs a third of entering the condition.
        self.mutex = threading.RLock()
        self.lock = threading.Condition(self.mutex)
        self._tables: list[Table] = []
        self._column_tuple = tuple(self.columns.values())
        self._path_tuple = tuple(self.columns)
        self._choose_row_writer()

    # ----------------------------------------------------------------- queries
    @property
    def num_steps(self) -> int:
        """Steps currently held (at most ``capacity``)."""
        return min(self.next_id, self.capacity)

    @property
    def oldest_id(self) -> int:
        """Id of the oldest step still stored."""
        return max(0, self.next_id - self.capacity)

    @property
    def nbytes(self) -> int:
        return sum(col.nbytes for col in self.columns.values())

    def is_stored(self, step_id: int) -> bool:
        return self.oldest_id <= step_id < self.next_id

    def read(self, step_ids: np.ndarray | int) -> dict[str, np.ndarray]:
        """Copy of the steps with the given ids (which must still be stored)."""
        ids = np.asarray(step_ids, dtype=np.int64)
        if ids.size and (ids.min() < self.oldest_id or ids.max() >= self.next_id):
            raise InvalidArgumentError(
                f"step ids {describe(ids.tolist())} are not all stored; the store holds ids "
                f"[{self.oldest_id}, {self.next_id})"
            )
        rows = ids % self.capacity
        return {p: col[rows] for p, col in self.columns.items()}

    # ---------------------------------------------------------------- mutation
    def attach(self, table: Table) -> None:
        with self.mutex:
            self._tables.append(table)
            self._choose_row_writer()

    def detach(self, table: Table) -> None:
        with self.mutex:
            if table in self._tables:
                self._tables.remove(table)
            self._choose_row_writer()

    def _choose_row_writer(self) -> None:
        """Use the compiled one-step write where a row may be written before the tables
        have let go of it: one lane, and every table evicts what is overwritten (a queue
        waits for its items, a stack copies their steps away first)."""
        evict_only = all(t.on_overwrite == "evict" for t in self._tables)
        self._compiled_writes = _kernel is not None and self.lanes == 1 and evict_only

    def append(
        self, steps: Mapping[str, Any], *, timeout: float | None = None, validated: bool = False
    ) -> int:
        """Append a batch of steps (every field ``[n, ...]``); returns the first new id.

        With ``lanes > 1``, ``n`` must be a multiple of ``lanes`` (row ``j`` goes to lane
        ``j % lanes``). Items anchored on rows about to be overwritten are removed from
        every attached table first; a table created with ``on_overwrite="block"`` (queues)
        instead makes the append wait, up to ``timeout`` seconds (``None``: forever),
        until those items have been consumed.

        Raises:
            ReplayTimeoutError: if a blocking table kept the append waiting past ``timeout``.
            SignatureError: if ``steps`` does not match the signature.
            InvalidArgumentError: if ``n`` is 0, over ``capacity`` or not a multiple of lanes.
        """
        if validated:
            arrays, n = steps, len(next(iter(steps.values())))
        else:
            arrays, n = self.signature.check_batch(steps, "steps")
        if n < 1 or n > self.capacity or n % self.lanes:
            raise InvalidArgumentError(
                f"a batch of {n} steps cannot be appended: give between 1 and "
                f"capacity={self.capacity} steps, a multiple of lanes={self.lanes}"
            )
        with self.mutex:
            return self._append_locked(arrays, n, timeout)

    def _make_room(self, n: int, timeout: float | None) -> int:
        """Wait until no blocking table has items on the next ``n`` rows, evict the items
        of the others there, and return the first row to write. Called with the lock."""
        deadline = None if timeout is None else time.monotonic() + timeout
        tables = self._tables
        moved = 0
        while self.next_id + n > self.capacity:
            start = self.next_id % self.capacity
            if any(t.on_overwrite == "relocate" for t in tables) and any(
                t._relocate_pinned(start, n, timeout) for t in tables
            ):
                moved += 1
                if moved > self.capacity:
                    raise InvalidArgumentError(
                        f"the store's {self.capacity} steps are too few for the items a "
                        "relocating table (a stack) keeps waiting; enlarge the store"
                    )
                continue
            if len(tables) == 1:
                blocked = tables[0]._blocks_overwrite(start, n)
            else:
                blocked = any(t._blocks_overwrite(start, n) for t in tables)
            if not blocked:
                for table in self._tables:
                    table._on_overwrite(start, n)
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ReplayTimeoutError(
                    f"appending {n} steps waited {timeout}s for queue items on the rows to be "
                    "overwritten to be consumed; sample them, enlarge the store's capacity "
                    "or raise the timeout"
                )
            self.lock.wait(remaining)
        return self.next_id % self.capacity

    def _append_locked(
        self, arrays: Mapping[str, np.ndarray], n: int, timeout: float | None = None
    ) -> int:
        start = self._make_room(n, timeout)
        first = self.next_id
        end = start + n
        if end <= self.capacity:
            for path, col in self.columns.items():
                col[start:end] = arrays[path]
        else:
            split = self.capacity - start
            for path, col in self.columns.items():
                src = arrays[path]
                col[start:] = src[:split]
                col[: end - self.capacity] = src[split:]
        self.next_id = first + n
        return first

    def _write_row_locked(self, step: Mapping[str, Any]) -> int | None:
        """Write one step that fits the columns as it is to the next row, for the only
        table over this store, which takes care of the item on that row itself (the
        one-row insert); returns the step's id. ``None``, with nothing written, when the
        compiled write is off, other tables share the store, or the step needs
        validation."""
        if not self._compiled_writes or len(self._tables) != 1:
            return None
        first = self.next_id
        row = first % self.capacity
        if not _kernel.put_row(np.ndarray, self._column_tuple, self._path_tuple, row, step):
            return None
        self.next_id = first + 1
        return first

    def _advance_written(self, start: int, n: int) -> int:
        """Account for ``n`` steps just written by the compiled write at rows ``start ..``
        (no wrap): the tables evict their items there, then the ids advance. Returns the
        first new id."""
        if self.next_id + n > self.capacity:
            for table in self._tables:
                table._on_overwrite(start, n)
        first = self.next_id
        self.next_id = first + n
        return first

    def _append_steps_locked(
        self, steps: Mapping[str, Any], n: int, timeout: float | None, argument: str = "steps"
    ) -> int:
        """Append ``n`` steps (every field ``[n, ...]``, validated here unless they fit the
        columns as they are) with the lock held; returns the first id.

        Steps that fit go through the compiled write when it is on (see
        :meth:`_append_one_locked`) and do not wrap around the ring.

        Raises:
            SignatureError: if the steps do not match the signature (``argument`` names
                them); nothing changes then.
            ReplayTimeoutError: as :meth:`append`.
        """
        if self._compiled_writes:
            start = self.next_id % self.capacity
            cols, paths = self._column_tuple, self._path_tuple
            if start + n <= self.capacity and _kernel.put_rows(
                np.ndarray, cols, paths, start, n, steps
            ):
                return self._advance_written(start, n)
        arrays, n = self.signature.check_batch(steps, argument)
        return self._append_locked(arrays, n, timeout)

    def _append_one_locked(
        self, step: Mapping[str, Any], timeout: float | None = None, argument: str = "step"
    ) -> int:
        """Append one step (no batch axis; values may be Python scalars) to a single-lane
        store with the lock held; returns its id. Writers and the one-row
        :meth:`Table.insert` path call it.

        A step whose values fit the columns as they are goes through the compiled write
        (when every table evicts what is overwritten, the row is written before they do);
        any other is validated by the signature first.

        Raises:
            SignatureError: if the step does not match the signature (``argument`` names
                it); nothing changes then.
            ReplayTimeoutError: as :meth:`append`.
        """
        if self._compiled_writes:
            row = self.next_id % self.capacity
            if _kernel.put_row(np.ndarray, self._column_tuple, self._path_tuple, row, step):
                return self._advance_written(row, 1)
        step = self.signature.check_row(step, argument)
        row = self._make_room(1, timeout) if self.next_id >= self.capacity else self.next_id
        first = self.next_id  # read after _make_room, which may wait for other appends
        for path, col in self.columns.items():
            col[row] = step[path]
        self.next_id = first + 1
        return first

    def reset(self) -> None:
        """Forget every step (the arrays keep their memory); attached tables are reset."""
        with self.mutex:
            for table in self._tables:
                table._reset_locked()
            self.next_id = 0
            self.lock.notify_all()

    def __repr__(self) -> str:
        return (
            f"StepStore(capacity={self.capacity}, lanes={self.lanes}, steps={self.num_steps}, "
            f"{self.signature!r})"
        )
