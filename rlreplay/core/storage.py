"""The step store: columnar ring storage shared by one or more tables.

Each field of the signature is one preallocated numpy array of ``capacity`` rows. Every
appended step gets a monotonically increasing step id; it lives in row ``id % capacity``
until ``capacity`` newer steps overwrite it. Tables never copy step data: their items
are windows (anchor row plus per-field offsets) over these arrays.

With ``lanes > 1`` the store holds ``lanes`` interleaved streams advancing in lockstep
(one step per lane per append), as a vector environment produces them: step ``k`` of lane
``i`` has id ``k * lanes + i``, so consecutive steps of one lane are ``lanes`` ids apart and
an item's window uses that stride.

What happens to the items and to writers' retained steps on rows about to be
overwritten is decided in one place, the store's :class:`~rlreplay.core.overwrite.
OverwriteProtocol` (``store.overwrite``; its docstring states the invariant). All mutation
happens under ``store.mutex``, which every table over the store shares; blocked calls
wait through ``store.waits`` (:class:`~rlreplay.core.waiting.Waits`).

The store's parts: its capacity and columns, made or checked before anything changes
(:mod:`rlreplay.core.store_columns`), and which chunks of rows changed since a checkpoint
(:mod:`rlreplay.core.store_changes`, ``store.changes``). The write paths stay here, on the
store's own attributes: no indirection per row.
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
    """What :meth:`StepStore.observe` takes: told of changes to the rows before they are
    made, with the store's lock held."""

    def before_write(self, first: int, n: int) -> None:
        """``n`` steps are about to be written from id ``first``."""

    def before_reset(self) -> None:
        """Every row is about to be given up (a reset, or the columns replaced)."""


class StepStore:
    """Columnar ring of steps.

    Args:
        signature: field specs of one step (nested dicts allowed).
        capacity: number of steps kept; older steps are overwritten.
        lanes: number of lockstep streams (1 for a plain stream).
        capacity_bytes: instead of ``capacity``: the bytes the columns may take; the
            capacity is the most steps (a multiple of ``lanes``) that fit.
        columns: arrays to hold the steps instead of new ones, one of
            ``(capacity, *shape)`` per field (e.g. a checkpoint's memory-mapped files).
            They are not counted against available memory: their pages belong to files
            or were allocated already.

    Raises:
        InvalidArgumentError: if ``capacity`` is not a positive multiple of ``lanes``, or
            neither or both of ``capacity`` and ``capacity_bytes`` are given, or a given
            column does not match its field's shape and dtype.
        InsufficientMemoryError: if new columns need more memory than is available (see
            :mod:`rlreplay.core.memory`); nothing is allocated.

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
        # Every mutation holds ``mutex``; blocked calls wait through ``waits``, each on a
        # condition of its own over it (see :class:`~rlreplay.core.waiting.Waits`).
        self.mutex = threading.RLock()
        self.waits = waiting.Waits(self.mutex)
        self._column_tuple = tuple(self.columns.values())
        self._path_tuple = tuple(self.columns)
        # Whether writes of steps that fit the columns as they are go through the compiled
        # kernel (one call per write); False: the numpy path (the tests compare them).
        self.compiled_writes = _kernel is not None
        self.overwrite = OverwriteProtocol(self)
        # Which rows changed between two checkpoints (see :mod:`rlreplay.core.store_changes`).
        self.changes = ChangedChunks(self.signature, self.capacity)
        # Told before rows change (lock held): see :meth:`observe`.
        self.observers: tuple[StoreObserver, ...] = ()
        # Called by wake_waiters beside the lock's waiters: waiters of another kind (a
        # server's parked calls), told without taking this store's lock themselves.
        self.wakers: tuple[Callable[[], None], ...] = ()

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
        """Copy of the steps with the given ids (which must still be stored).

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
        """Copy of the ``n`` steps from id ``first`` on (stored; lock held)."""
        return self.read_rows((first + np.arange(n)) % self.capacity)

    # ------------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        """The store's bookkeeping for checkpoints (lock held): the next step id and the
        steps relocated so far. The columns are not part of it: a checkpoint streams them
        itself (see :mod:`rlreplay.checkpoint`)."""
        return {"next_id": self.next_id, "relocated_steps": self.overwrite.relocated_steps}

    def stamp_chunks(self) -> int:
        """Bring ``chunk_generations`` up to date (lock held) and return the current
        write generation (see :class:`~rlreplay.core.store_changes.ChangedChunks`)."""
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
        """This store's contents, for checkpoints: new with every store and whenever
        :meth:`load_state` replaces its columns."""
        return self.changes.identity

    def load_state(
        self, state: Mapping[str, Any], columns: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """Put back what :meth:`state` returned; ``columns`` (one array of
        ``(capacity, *shape)`` per field, e.g. memory-mapped files) replace the store's
        own arrays when given. Writers' retained steps are released: they belonged to
        the steps this replaces.

        Raises:
            InvalidArgumentError: if ``next_id`` is negative or a column does not match
                its field's shape and dtype; nothing changes then.
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

    # ---------------------------------------------------------------- mutation
    def observe(self, observer: StoreObserver) -> None:
        """Tell ``observer`` of every change to the rows from now on, before it is made
        (core-internal, lock held): ``before_write(first_id, n)`` before a write of ``n``
        steps from id ``first_id``, ``before_reset()`` before every row is given up (a
        reset, columns replaced). A checkpoint streaming the columns copies aside the
        rows it has not written yet."""
        self.observers = (*self.observers, observer)

    def unobserve(self, observer: StoreObserver) -> None:
        """Stop telling ``observer`` (lock held; one not observing is ignored)."""
        self.observers = tuple(o for o in self.observers if o is not observer)

    def attach(self, table: RowHolder) -> weakref.ref:
        """Let ``table``'s items hold rows of this store (see :mod:`overwrite`); returns
        the weak reference the store keeps of it (the table's ``store_ref``)."""
        with self.mutex:
            return self.overwrite.attach(table)

    def detach(self, table: RowHolder) -> None:
        """Forget ``table``: its items no longer hold rows (:meth:`Table.close`)."""
        with self.mutex:
            self.overwrite.detach(table)
            self.waits.wake_all()  # appends waiting for its items may go on

    def wake_waiters(self) -> None:
        """Core-internal, for the tables, writers and overwrite protocol over this store,
        with ``mutex`` held: wake the calls waiting on the lock after a change that may let
        them go on (only when one may: :class:`~rlreplay.core.waiting.Waits`; skipped when
        none waits, as on almost every insert and sample, where a call costs more than the
        check), and call every waker (see :meth:`add_waker`)."""
        waits = self.waits
        if waits.blocked:
            waits.wake()
        for waker in self.wakers:
            waker()

    def add_waker(self, waker: Callable[[], None]) -> None:
        """Call ``waker()`` after every change that may let a waiting call go on (an
        insert, a sample, a delete, a reset), with the store's lock held: it must return
        at once and never take the lock. A server parks the calls a limiter blocks and
        retries them when woken, so a change made in its own process (a learner sampling
        the served table) lets a parked insert in at once."""
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

        With ``lanes > 1``, ``n`` must be a multiple of ``lanes`` (row ``j`` goes to lane
        ``j % lanes``). Items anchored on rows about to be overwritten are handed over as
        their tables' ``on_overwrite`` says (see :mod:`rlreplay.core.overwrite`); a queue's
        items (``on_overwrite="block"``) make the append wait, up to ``timeout`` seconds in
        all (``None``: without limit), until they are consumed.

        Raises:
            SignatureError: if ``steps`` does not match the signature.
            InvalidArgumentError: if ``n`` is 0, over ``capacity`` or not a multiple of
                lanes, or the store cannot hold what writers retain plus ``n`` steps.
            ReplayTimeoutError: if a queue kept the append waiting past ``timeout``;
                nothing is appended then.
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
        """Append ``n`` validated steps with the lock held (waiting for queues as
        :meth:`append`); returns the first id."""
        waiter = None
        while True:
            if self.overwrite.make_room(n) is not None:
                return self.write(arrays, n)
            waiter = waiter or self.blocked_call(timeout, "append")
            if not waiter.wait():
                raise self.timeout_error(n, timeout)

    def blocked_call(self, timeout: float | None, what: str) -> waiting.BlockedCall:
        """The waiting of an append held back by a queue's items (one warning if long)."""
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
        """Core-internal, for the tables, writers and overwrite protocol over this store,
        with ``mutex`` held: write ``n`` steps at the head; returns the first id.

        The rows are ones the overwrite protocol has freed, or ones the table it lets
        replace its own items there (``overwrite.sole``) is about to claim. ``one_row``:
        ``steps`` is one step without the batch axis (``n`` is 1). ``checked``: the steps
        were validated (they match the columns), so the write cannot fail; with
        ``checked=False`` they are written only when they fit the columns as they are
        and do not wrap (the compiled write), else nothing is written and ``None``
        returned, for the caller to validate them first.
        """
        first = self.next_id
        for observer in self.observers:
            observer.before_write(first, n)
        start = first % self.capacity
        end = start + n
        # Steps that fit the columns as they are (what validation returns) in one
        # compiled call when they do not wrap; it writes nothing when one does not fit.
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
        # Values were checked (the casting rule in value_casting.py refuses a finite float
        # that would become inf); numpy's overflow check is not needed again here.
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
        """Forget every step (the arrays keep their memory); attached tables are reset and
        writers' retained steps released."""
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
