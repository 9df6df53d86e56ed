"""The step store: columnar ring storage shared by one or more tables.

Each field is one preallocated array; step ``i`` lives in row ``i % capacity`` until
overwritten, and items are windows over these arrays (never copies). The store's
:class:`~rlreplay.core.overwrite.OverwriteProtocol` decides what happens to items on rows
about to be overwritten. All mutation happens under ``store.mutex``, shared by its tables.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rlreplay.core import waiting
from rlreplay.core._compiled import load_kernel
from rlreplay.core.overwrite import OverwriteProtocol, RowHolder
from rlreplay.core.specs import Signature
from rlreplay.core.store_changes import CHECKPOINT_CHUNK_ALIGN, ChangedChunks
from rlreplay.core.store_columns import checked_columns, new_columns, store_capacity
from rlreplay.errors import InvalidArgumentError, ReplayTimeoutError, check_count, describe

if TYPE_CHECKING:
    import weakref

__all__ = ["CHECKPOINT_CHUNK_ALIGN", "StepStore"]  # the alignment: for checkpoint files

_kernel = load_kernel("rlreplay.core._store")


class StoreObserver(Protocol):
    """What :meth:`StepStore.observe` takes: told of row changes before they are made, lock held."""

    def before_write(self, first: int, n: int) -> None:
        """``n`` steps are about to be written from id ``first``."""

    def before_reset(self) -> None:
        """Every row is about to be given up."""


class StepStore:
    """Columnar ring of steps.

    Args:
        signature: field specs of one step (nested dicts allowed).
        capacity: number of steps kept; older steps are overwritten.
        lanes: number of lockstep streams (1 for a plain stream): step ``k`` of lane ``i`` has
            id ``k * lanes + i`` (an append's row ``j`` goes to lane ``j % lanes``).
        capacity_bytes: instead of ``capacity``: the bytes the columns may take.
        columns: arrays to use instead of new ones, one ``(capacity, *shape)`` per field (e.g.
            a checkpoint's memory-mapped files); not counted against available memory.

    Raises:
        InvalidArgumentError: if ``capacity`` is not a positive multiple of ``lanes``, neither
            or both of ``capacity`` and ``capacity_bytes`` are given, or a column mismatches.
        InsufficientMemoryError: if new columns do not fit in memory; nothing is allocated.

    Example:
        >>> store = StepStore({"obs": ((4,), "float32")}, capacity=8)
        >>> store.append({"obs": np.ones((3, 4))})
        0
        >>> store.num_steps
        3
    """

    def __init__(
        self,
        signature: Mapping[str, Any] | Signature,
        capacity: int | None = None,
        lanes: int = 1,
        *,
        capacity_bytes: int | None = None,
        columns: Mapping[str, np.ndarray] | None = None,
    ):
        self.signature = Signature(signature)
        self.capacity, self.lanes = store_capacity(self.signature, capacity, lanes, capacity_bytes)
        if columns is not None:
            self.columns: dict[str, np.ndarray] = checked_columns(
                self.signature, self.capacity, columns
            )
        else:
            self.columns = new_columns(self, self.signature, self.capacity, capacity_bytes)
        self.next_id = 0
        self.mutex = threading.RLock()  # held by every mutation; blocked calls wait on waits
        self.waits = waiting.Waits(self.mutex)
        self._column_tuple = tuple(self.columns.values())
        self._path_tuple = tuple(self.columns)
        # Whether fitting writes go through the compiled kernel; False: the numpy path.
        self.compiled_writes = _kernel is not None
        self.overwrite = OverwriteProtocol(self)
        self.changes = ChangedChunks(self.signature, self.capacity)
        self.observers: tuple[StoreObserver, ...] = ()
        # Woken beside the lock's waiters, without taking the lock (a server's parked calls).
        self.wakers: tuple[Callable[[], None], ...] = ()

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
        """Copy of the steps with the given ids.

        Raises:
            InvalidArgumentError: if an id is not stored.
        """
        ids = np.asarray(step_ids, dtype=np.int64)
        with self.mutex:
            if ids.size and (ids.min() < self.oldest_id or ids.max() >= self.next_id):
                raise InvalidArgumentError(
                    f"step ids {describe(ids.tolist())} are not all stored; the store holds "
                    f"ids [{self.oldest_id}, {self.next_id})"
                )
            return self.read_rows(ids % self.capacity)

    def read_rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Copy of the given rows, field by field (lock held)."""
        return {p: col[rows] for p, col in self.columns.items()}

    def read_range(self, first: int, n: int) -> dict[str, np.ndarray]:
        """Copy of the ``n`` steps from id ``first`` on (lock held)."""
        return self.read_rows((first + np.arange(n)) % self.capacity)

    def state(self) -> dict[str, Any]:
        """The store's bookkeeping for checkpoints (lock held); the columns are not part of it."""
        return {"next_id": self.next_id, "relocated_steps": self.overwrite.relocated_steps}

    def stamp_chunks(self) -> int:
        """Bring ``chunk_generations`` up to date (lock held); return the write generation."""
        return self.changes.stamp(self.next_id)

    @property
    def chunk_rows(self) -> int:
        """Rows per checkpoint chunk of the columns."""
        return self.changes.chunk_rows

    @property
    def chunk_generations(self) -> np.ndarray:
        """Per checkpoint chunk, the write generation of its last stamped write."""
        return self.changes.generations

    @property
    def write_generation(self) -> int:
        """The generation of the latest :meth:`stamp_chunks`."""
        return self.changes.write_generation

    @property
    def identity(self) -> str:
        """This store's contents: new with every store and every column replacement."""
        return self.changes.identity

    def load_state(
        self, state: Mapping[str, Any], columns: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """Put back what :meth:`state` returned; ``columns``, if given, replace the arrays.
        Writers' retained steps are released (items cannot reach steps appended before).

        Raises:
            InvalidArgumentError: if ``next_id`` is negative or a column mismatches; nothing
                changes then.
        """
        next_id = state["next_id"]
        check_count(next_id, "next_id", minimum=0)
        if columns is not None:
            checked = checked_columns(self.signature, self.capacity, columns)
            with self.mutex:  # other contents: no chunk matches an earlier checkpoint
                for observer in self.observers:  # e.g. a checkpoint streaming the old columns
                    observer.before_reset()
                self.columns = checked
                self._column_tuple = tuple(self.columns.values())
                self.changes.replaced()
        with self.mutex:
            self.stamp_chunks()
            for retention in self.overwrite.retentions():
                retention.release()
            self.next_id = self.changes.stamped_to = int(next_id)
            self.overwrite.relocated_steps = int(state.get("relocated_steps", 0))
            self.waits.wake_all()

    def observe(self, observer: StoreObserver) -> None:
        """Core-internal: tell ``observer`` of every row change before it is made (lock held)."""
        self.observers = (*self.observers, observer)

    def unobserve(self, observer: StoreObserver) -> None:
        """Stop telling ``observer`` (lock held)."""
        self.observers = tuple(o for o in self.observers if o is not observer)

    def attach(self, table: RowHolder) -> weakref.ref:
        """Let ``table``'s items hold rows of this store; returns the store's weakref to it."""

        with self.mutex:
            return self.overwrite.attach(table)

    def detach(self, table: RowHolder) -> None:
        """Forget ``table``: its items no longer hold rows."""
        with self.mutex:
            self.overwrite.detach(table)
            self.waits.wake_all()  # appends waiting for its items may go on

    def wake_waiters(self) -> None:
        """Core-internal: wake the calls a change may let go on, and every waker (lock held)."""
        waits = self.waits
        if waits.blocked:
            waits.wake()
        for waker in self.wakers:
            waker()

    def add_waker(self, waker: Callable[[], None]) -> None:
        """Call ``waker()`` after every change that may let a waiting call go on (lock held).

        It must return at once and never take the lock.
        """
        with self.mutex:
            self.wakers = (*self.wakers, waker)

    def remove_waker(self, waker: Callable[[], None]) -> None:
        """Stop calling ``waker`` (one not added is ignored)."""
        with self.mutex:
            self.wakers = tuple(w for w in self.wakers if w is not waker)

    def append(
        self, steps: Mapping[str, Any], *, timeout: float | None = None, validated: bool = False
    ) -> int:
        """Append a batch of steps (every field ``[n, ...]``); returns the first new id.

        A queue's items on rows about to be overwritten make it wait up to ``timeout`` seconds.

        Raises:
            SignatureError: if ``steps`` does not match the signature.
            InvalidArgumentError: if ``n`` is 0, over ``capacity`` or not a multiple of lanes, or
                the store cannot hold what writers retain plus ``n`` steps.
            ReplayTimeoutError: if a queue kept the append waiting past ``timeout``; nothing is
                appended then.
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

    def _append_locked(
        self, arrays: Mapping[str, np.ndarray], n: int, timeout: float | None = None
    ) -> int:
        """Append ``n`` validated steps with the lock held; returns the first id."""
        waiter = None
        while True:
            if self.overwrite.make_room(n) is not None:
                return self.write(arrays, n)
            waiter = waiter or self.blocked_call(timeout, "append")
            if not waiter.wait():
                raise self.timeout_error(n, timeout)

    def blocked_call(self, timeout: float | None, what: str) -> waiting.BlockedCall:
        """The waiting of an append held back by a queue's items."""
        return waiting.BlockedCall(
            self.waits, timeout, waiting.WARN_AFTER_S, lambda: self._blocked_text(what)
        )

    def _blocked_text(self, what: str) -> str:
        return (
            f"an {what} to the step store has waited over {waiting.WARN_AFTER_S}s for the items of "
            f"queue table {self.overwrite.blocker!r} on the rows it would overwrite: no "
            "sampler is consuming that queue (sample it, or enlarge the store)"
        )

    def timeout_error(self, n: int, timeout: float | None) -> ReplayTimeoutError:
        return ReplayTimeoutError(
            f"appending {n} steps waited {timeout}s for the items of queue table "
            f"{self.overwrite.blocker!r} on the rows to be overwritten to be consumed: no "
            "sampler is consuming that queue (sample it, enlarge the store's capacity or "
            "raise the timeout)"
        )

    def write(
        self,
        steps: Mapping[str, Any],
        n: int,
        *,
        one_row: bool = False,
        checked: bool = True,
    ) -> int | None:
        """Core-internal: write ``n`` steps at the head, ``mutex`` held; returns the first id.
        Call only after ``overwrite.make_room(n)`` freed these rows in the same lock hold.

        With ``checked=False`` steps that do not fit the columns as they are, or would wrap, are
        not written and ``None`` is returned, for the caller to validate them first.
        """
        first = self.next_id
        for observer in self.observers:
            observer.before_write(first, n)
        start = first % self.capacity
        end = start + n
        if end <= self.capacity and self.compiled_writes:
            cols, paths = self._column_tuple, self._path_tuple
            if (
                _kernel.put_row(np.ndarray, cols, paths, start, steps)
                if one_row
                else _kernel.put_rows(np.ndarray, cols, paths, start, n, steps)
            ):
                self.next_id = first + n
                return first
        if not checked:
            return None
        # Values were checked (value_casting.py refuses floats that would become inf).
        with np.errstate(over="ignore"):
            if end <= self.capacity:
                for path, col in self.columns.items():
                    col[start:end] = steps[path]
            else:
                split = self.capacity - start
                for path, col in self.columns.items():
                    src = steps[path]
                    col[start:] = src[:split]
                    col[: end - self.capacity] = src[split:]
        self.next_id = first + n
        return first

    def reset(self) -> None:
        """Forget every step; attached tables are reset and retained steps released."""
        with self.mutex:
            for observer in self.observers:
                observer.before_reset()
            for table in self.overwrite.tables():
                table.reset_locked()
            for retention in self.overwrite.retentions():
                retention.release()
            self.stamp_chunks()
            self.next_id = self.changes.stamped_to = 0
            self.waits.wake_all()

    def __repr__(self) -> str:
        return (
            f"StepStore(capacity={self.capacity}, lanes={self.lanes}, steps={self.num_steps}, "
            f"{self.signature!r})"
        )
