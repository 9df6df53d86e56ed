"""The moment of a checkpoint: every part's state taken under its store's lock.

For each store, with its lock held: the store's bookkeeping (:meth:`StepStore.state`),
and for each of the tables being saved over it, its item index (per-slot priorities,
generations, times sampled, live flags and extents; size, counters, generation origin;
both selectors' states), its rate limiter's counters and its random generator's state.
These are copies (per slot, a few dozen bytes); the step columns are not copied here but
streamed afterwards by a :class:`~rlreplay.checkpoint.streaming.ColumnStream`, installed
as the store's guard in the same lock hold so that the files show the columns as of
this moment.

A large index (many items) is not copied in that one hold: its per-slot arrays (records,
live flags, extents, a prioritized sampler's trees) are copied a slice per lock hold
first, the index noting the slots its mutations change meanwhile
(:mod:`rlreplay.core.slot_changes`), and the moment's hold copies again only what those
slots changed, with the rest of the state. Table calls wait for one slice, or for the
moment's hold, never for the whole copy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.checkpoint.definitions import store_definition, table_definition
from rlreplay.checkpoint.increments import Previous
from rlreplay.checkpoint.streaming import ColumnStream
from rlreplay.core import item_state
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import CheckpointError, ClosedError, InvalidArgumentError, describe

# An index whose per-item state is larger than this is copied a slice at a time (with
# the lock released between slices), then finished at the moment; a smaller one is
# copied whole at the moment.
SLICED_ABOVE_BYTES = 32 << 20
SLICE_BYTES = 4 << 20  # bytes one lock hold of the sliced copy copies


def table_state(
    table: Table, buffers: dict[str, Any] | None = None, sliced: tuple | None = None
) -> dict[str, Any]:
    """The table's parts' states (lock held): index (copied into ``buffers`` from
    ``table.index.state_buffers()`` when given; finished from ``sliced``, what
    :func:`_copy_in_slices` copied, when given), rate limiter, random generator."""
    if sliced is not None:
        index = item_state.finish_sliced_snapshot(table.index, *sliced, buffers, True)
    else:
        index = table.index.state(buffers, idle_remover_later=True)
    return {
        "index": index,
        "rate_limiter": table.rate_limiter.state(),
        "rng": table.rng.bit_generator.state,
    }


def as_tables(tables: Table | Sequence[Table] | Mapping[str, Table]) -> list[Table]:
    """``tables`` as a list of distinct tables with distinct names.

    Raises:
        InvalidArgumentError: for an empty or malformed argument, or two tables sharing a
            name (a checkpoint names its tables).
    """
    if isinstance(tables, Table):
        items = [tables]
    elif isinstance(tables, Mapping):
        items = list(tables.values())
    elif isinstance(tables, Sequence) and not isinstance(tables, (str, bytes)):
        items = list(tables)
    else:
        items = None
    if not items or not all(isinstance(t, Table) for t in items):
        raise InvalidArgumentError(
            f"tables={describe(tables)} must be a Table, or a non-empty list or dict of Tables"
        )
    names = [t.name for t in items]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidArgumentError(
            f"tables holds several tables named {dupes}; a checkpoint tells tables apart by "
            "name, so give each table its own name"
        )
    return items


@dataclass
class StoreSnapshot:
    """One store at the checkpoint's moment: definition, bookkeeping, column stream."""

    store: StepStore
    definition: dict[str, Any]
    state: dict[str, Any]
    stream: ColumnStream
    column_files: dict[str, list[str]]  # field path to its chunk files' names
    increments: dict[str, Any]  # the store's identity and write generation at the moment
    previous: Previous | None = None  # the newest checkpoint's copy of this store
    reusable: np.ndarray | None = None  # chunks unchanged since ``previous``


@dataclass
class TableSnapshot:
    """One table at the checkpoint's moment."""

    table: Table
    store: int  # index into the snapshot's stores
    definition: dict[str, Any]
    state: dict[str, Any]


@dataclass
class Snapshot:
    """Every part's state at the checkpoint's moment (one moment per store)."""

    stores: list[StoreSnapshot] = field(default_factory=list)
    tables: list[TableSnapshot] = field(default_factory=list)
    created_unix: float = 0.0
    held_s: float = 0.0  # the longest lock hold of the capture, in seconds
    # (table, index state, buffers) of idle removers whose state finish() still makes
    idle_removers: list[tuple[Table, dict[str, Any], Any]] = field(default_factory=list)

    def finish(self) -> None:
        """Make the idle removers' states (an index build over every item) from the
        captured arrays: it reads nothing live, so it runs after the moment is taken
        and the caller (a server's dispatcher) goes on."""
        for table, index_state, into in self.idle_removers:
            index_state["remover"] = table.index.idle_remover_state(index_state, into)
        self.idle_removers = []

    def release(self) -> None:
        """Take the column streams off their stores (after streaming, or on failure)."""
        for s in self.stores:
            with s.store.mutex:
                if s.store.guard is s.stream:
                    s.store.guard = None


def _check(store: StepStore, tables: list[Table], starting: bool = False) -> None:
    """Refuse closed tables and a store another checkpoint streams, or (``starting`` a
    sliced copy) whose index another capture copies in slices now (lock held).

    Raises:
        ClosedError: if a table is closed.
        CheckpointError: if the store is being checkpointed already.
    """
    for t in tables:
        if t.closed:
            raise ClosedError(f"table {t.name!r} is closed; it cannot be saved")
    if store.guard is not None or (starting and any(t.index.changes is not None for t in tables)):
        raise CheckpointError(
            "a checkpoint of this store is being written already; wait for it to finish "
            "before taking another"
        )


def column_files(si: int, store: StepStore) -> dict[str, list[str]]:
    """The file names of store ``si``'s columns, one per chunk of ``store.chunk_rows``."""
    n = len(store.chunk_generations)
    return {
        p: [f"s{si}.c{ci}.k{k:06d}.npy" for k in range(n)]
        for ci, p in enumerate(store.signature.fields)
    }


class Capture:
    """The capture of ``tables``' state, taken a step at a time: the one mechanism under
    every save (:func:`capture` takes its steps back to back; a server's dispatcher takes
    one between requests, so that requests go on being served during the copy).

    Steps, each short: make the buffers the copies go into (outside any lock; with
    ``buffers_in_thread``, in a helper thread while :meth:`step` returns at once, since
    first writes to fresh memory are slow), then, for the indexes whose per-item state
    exceeds ``SLICED_ABOVE_BYTES``, start noting their changed slots (one short hold per
    store) and copy ``slice_bytes`` per step under the store's lock. When :attr:`ready`,
    :meth:`moment` takes the checkpoint's moment: one short hold per store copying again
    what changed meanwhile and the rest of the state.

    Args:
        tables: the tables (distinct, see :func:`as_tables`).
        slice_bytes: bytes one step copies (default ``SLICE_BYTES``).
        buffers_in_thread: make the buffers in a helper thread (for an index over
            ``SLICED_ABOVE_BYTES``; a small one's are made by the first step).

    Attributes:
        held_s: the longest lock hold of the capture so far, in seconds.
    """

    def __init__(
        self, tables: list[Table], *, slice_bytes: int | None = None, buffers_in_thread=False
    ):
        self.tables = tables
        self.slice_bytes = max(1, int(SLICE_BYTES if slice_bytes is None else slice_bytes))
        self.held_s = 0.0
        self.stores: list[StepStore] = []
        for t in tables:
            if not any(t.store is s for s in self.stores):
                self.stores.append(t.store)
        # (a small index's buffers are made at once: a thread would only add a wait)
        big = sum(t.index.nbytes() for t in tables) > SLICED_ABOVE_BYTES
        self._in_thread = buffers_in_thread and big
        self._maker: threading.Thread | None = None
        self._buffers: list[list[Any]] | None = None  # per store, per table of it
        self._error: BaseException | None = None
        self._sliced: list[list[tuple] | None] | None = None  # per store, once started
        self._work: list[tuple] = []  # (store, source, copy, first, end), last first
        self.taken = False  # the moment is taken, or the capture was abandoned

    def mine(self, store: StepStore) -> list[Table]:
        return [t for t in self.tables if t.store is store]

    @property
    def waiting(self) -> bool:
        """Whether the next step waits for the helper thread making the buffers."""
        return self._maker is not None and self._maker.is_alive()

    @property
    def ready(self) -> bool:
        """Whether every step before the moment is done."""
        return self._sliced is not None and not self._work

    def _hold(self, t0: float) -> None:
        self.held_s = max(self.held_s, time.perf_counter() - t0)

    def _make_buffers(self) -> None:
        try:  # made before any lock, so that the copies under it write mapped memory
            self._buffers = [[t.index.state_buffers() for t in self.mine(s)] for s in self.stores]
        except BaseException as exc:  # handed to the capturing thread by step()
            self._error = exc

    def step(self) -> None:
        """Take the next step (at most one slice's lock hold); nothing once :attr:`ready`.

        Raises:
            ClosedError: if a table is closed.
            CheckpointError: if a store is being checkpointed already (the capture is
                abandoned then).
            MemoryError: if the buffers cannot be made.
        """
        if self.taken or self.ready:
            return
        if self._buffers is None:
            if not self._in_thread:
                self._make_buffers()
            elif self._maker is None:
                self._maker = threading.Thread(
                    target=self._make_buffers, daemon=True, name="rlreplay-capture-buffers"
                )
                self._maker.start()
                return
            elif self._maker.is_alive():
                return
            if self._error is not None:
                self.taken = True
                raise self._error
        if self._sliced is None:
            self._start()
            return
        store, source, copy, a, b = self._work.pop()
        with store.mutex:
            t0 = time.perf_counter()
            copy[a:b] = source[a:b]
            self._hold(t0)

    def _start(self) -> None:
        """Start noting changes in each large index (one hold per store) and plan its
        slices."""
        self._sliced = []
        assert self._buffers is not None
        try:
            for store, buffers in zip(self.stores, self._buffers):
                mine = self.mine(store)
                if sum(t.index.nbytes() for t in mine) <= SLICED_ABOVE_BYTES:
                    self._sliced.append(None)
                    continue
                with store.mutex:
                    t0 = time.perf_counter()
                    _check(store, mine, starting=True)
                    sliced = []
                    for t, b in zip(mine, buffers):
                        sliced.append(item_state.start_sliced_snapshot(t.index, b))
                    self._sliced.append(sliced)
                    self._hold(t0)
                for _, parts in sliced:
                    for source, copy, _ in parts:
                        step = max(1, self.slice_bytes // max(1, source[:1].nbytes))
                        for a in range(0, len(source), step):
                            self._work.append((store, source, copy, a, a + step))
        except BaseException:
            self.abandon()
            raise
        self._work.reverse()

    def abandon(self) -> None:
        """Stop the capture (the indexes stop noting changes); the moment is not taken."""
        self._work = []
        for store, sliced in zip(self.stores, self._sliced or []):
            if sliced is not None:
                with store.mutex:
                    for t in self.mine(store):
                        item_state.abandon_sliced_snapshot(t.index)
        self._sliced = self._sliced or []
        self.taken = True

    def moment(self, directory: Path, previous: Mapping[str, Previous] | None = None) -> Snapshot:
        """Take the checkpoint's moment (one hold per store, once :attr:`ready`) and
        install the column streams that will write into ``directory``; for a store in
        ``previous`` (by identity: the newest checkpoint's stores), note the chunks
        unchanged since.

        Raises:
            ClosedError: if a table is closed (nothing is captured then).
            CheckpointError: if a store is being checkpointed already, or the capture is
                not :attr:`ready`.
        """
        if self.taken or not self.ready:
            raise CheckpointError("the capture is not ready for its moment: step() it first")
        assert self._buffers is not None and self._sliced is not None
        snap = Snapshot(created_unix=time.time())
        try:
            for si, (store, buffers) in enumerate(zip(self.stores, self._buffers)):
                self._store_moment(snap, si, store, buffers, directory, previous)
        except BaseException:
            self.abandon()
            snap.release()
            raise
        self.taken = True
        snap.held_s = self.held_s
        snap.tables.sort(key=lambda ts: self.tables.index(ts.table))
        return snap

    def _store_moment(
        self,
        snap: Snapshot,
        si: int,
        store: StepStore,
        buffers: list[Any],
        directory: Path,
        previous: Mapping[str, Previous] | None,
    ) -> None:
        files = column_files(si, store)
        paths = {p: [directory / n for n in names] for p, names in files.items()}
        mine = self.mine(store)
        sliced = self._sliced[si] if self._sliced is not None else None
        with store.mutex:
            t0 = time.perf_counter()
            _check(store, mine)
            stream = ColumnStream(store, paths)
            generation = store.stamp_chunks()
            increments = {"store": store.identity, "generation": generation}
            prev = (previous or {}).get(store.identity)
            reusable = None if prev is None else prev.reusable(store)
            state = store.state()
            states = [
                table_state(t, b, None if sliced is None else sliced[i])
                for i, (t, b) in enumerate(zip(mine, buffers))
            ]
            if sliced is not None and self._sliced is not None:
                self._sliced[si] = None  # finished: nothing of it left to abandon
            store.guard = stream
            self._hold(t0)
        for t, st, b in zip(mine, states, buffers):
            if st["index"]["remover"] is None:  # built by finish(), after the moment
                snap.idle_removers.append((t, st["index"], (b or {}).get("remover")))
        snap.stores.append(
            StoreSnapshot(
                store, store_definition(store), state, stream, files, increments, prev, reusable
            )
        )
        for t, st in zip(mine, states):
            snap.tables.append(TableSnapshot(t, si, table_definition(t), st))


def capture(
    tables: list[Table], directory: Path, previous: Mapping[str, Previous] | None = None
) -> Snapshot:
    """Take every part's state of ``tables`` (a :class:`Capture`'s steps back to back,
    then its moment) and install the column streams that will write into
    ``directory``; see :meth:`Capture.moment`.

    Raises:
        ClosedError: if a table is closed (nothing is captured then).
        CheckpointError: if a store is being checkpointed already.
    """
    c = Capture(tables)
    while not c.ready:
        c.step()
    return c.moment(directory, previous)
