"""The moment of a checkpoint: every part's state taken under its store's lock.

A large index is copied a slice per lock hold before the moment
(:mod:`~rlreplay.checkpoint.state_files`), so table calls never wait for the whole copy.
See docs/checkpoints.md.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.checkpoint.definitions import store_definition, table_definition
from rlreplay.checkpoint.increments import Previous
from rlreplay.checkpoint.state_files import StateStream
from rlreplay.checkpoint.streaming import ColumnStream
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import CheckpointError, ClosedError, InvalidArgumentError, describe


def as_tables(tables: Table | Sequence[Table] | Mapping[str, Table]) -> list[Table]:
    """``tables`` as a list of distinct tables with distinct names.

    Raises:
        InvalidArgumentError: for an empty or malformed argument, or a repeated name.
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
    increments: dict[str, Any]  # the store's identity and write generation
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
    state_streams: list[StateStream] = field(default_factory=list)

    def finish(self) -> dict[str, dict[str, Any]]:
        """Finish the files of large indexes' per-item state; their manifest entries by file name.

        Raises:
            OSError: if a write failed.
        """
        entries: dict[str, dict[str, Any]] = {}
        for stream in self.state_streams:
            entries.update(stream.finish())
        return entries

    @property
    def state_peak_bytes(self) -> int:
        """The most bytes of per-item state held in memory at once."""
        return sum(s.peak_bytes for s in self.state_streams)

    def release(self) -> None:
        """Take the column streams off their stores and close the state streams' files."""
        for s in self.stores:
            with s.store.mutex:
                s.store.unobserve(s.stream)
        for stream in self.state_streams:
            stream.close()


SLICED_ABOVE_BYTES = 32 << 20
SLICE_BYTES = 4 << 20  # bytes one lock hold of the sliced copy copies


def table_state(
    table: Table, buffers: dict[str, Any] | None = None, index: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The table's parts' states (lock held); an idle remover's state is ``None``."""
    if index is None:
        index = table.index.state(buffers, idle_remover_later=True)
    return {
        "index": index,
        "rate_limiter": table.rate_limiter.state(),
        "rng": table.rng.bit_generator.state,
    }


def _check(store: StepStore, tables: list[Table], starting: bool = False) -> None:
    """Refuse closed tables and a store being checkpointed (lock held)."""
    for t in tables:
        if t.closed:
            raise ClosedError(f"table {t.name!r} is closed; it cannot be saved")
    streaming = any(isinstance(o, ColumnStream) for o in store.observers)
    if streaming or (starting and any(t.index.changes.tracking for t in tables)):
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
    """The capture of ``tables``' state, taken a step at a time, under every save.

    Large indexes are copied ``slice_bytes`` per step into files by a
    :class:`~rlreplay.checkpoint.state_files.StateStream`; when :attr:`ready`, :meth:`moment`
    takes the checkpoint's moment in one short hold per store.

    Args:
        tables: the tables (distinct, see :func:`as_tables`).
        slice_bytes: bytes one step copies (default ``SLICE_BYTES``).
        buffers_in_thread: make the buffers in a helper thread.
        staging: makes and returns the directory the slices' files go into (required for a
            capture in slices); by :meth:`moment` it must have become its ``directory``.

    Attributes:
        held_s: the longest lock hold of the capture so far, in seconds.
        staging_dir: the directory ``staging`` made (deleted if the capture is abandoned).
    """

    def __init__(
        self,
        tables: list[Table],
        *,
        slice_bytes: int | None = None,
        buffers_in_thread: bool = False,
        staging: Callable[[], Path] | None = None,
    ):
        self.tables = tables
        self.slice_bytes = max(1, int(SLICE_BYTES if slice_bytes is None else slice_bytes))
        self.held_s = 0.0
        self.stores: list[StepStore] = []
        for t in tables:
            if not any(t.store is s for s in self.stores):
                self.stores.append(t.store)
        # per store: whether its indexes are copied in slices
        self._big = [
            sum(t.index.nbytes() for t in self.mine(s)) > SLICED_ABOVE_BYTES for s in self.stores
        ]
        self._in_thread = buffers_in_thread and any(self._big)
        self._staging = staging
        self.staging_dir: Path | None = None
        self._maker: threading.Thread | None = None
        self._buffers: list[list[Any]] | None = None  # per store, per table of it
        self._error: BaseException | None = None
        # per store, once started: its state stream and the index states it fills
        self._sliced: list[tuple[StateStream, list[dict]] | None] | None = None
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
        return self._sliced is not None and self._next_stream() is None

    def _next_stream(self) -> StateStream | None:
        for sliced in self._sliced or []:
            if sliced is not None and sliced[0].work:
                return sliced[0]
        return None

    def _hold(self, t0: float) -> None:
        self.held_s = max(self.held_s, time.perf_counter() - t0)

    def _make_buffers(self) -> None:
        try:  # made before any lock, so the copies under it write mapped memory
            self._buffers = [
                [
                    t.index.moment_buffers() if big else t.index.state_buffers()
                    for t in self.mine(s)
                ]
                for s, big in zip(self.stores, self._big)
            ]
        except BaseException as exc:  # handed to the capturing thread by step()
            self._error = exc

    def step(self) -> None:
        """Take the next step (at most one slice's lock hold); nothing once :attr:`ready`.

        Raises:
            ClosedError: if a table is closed.
            CheckpointError: if a store is being checkpointed already (the capture is abandoned).
            MemoryError: if the buffers cannot be made.
            OSError: if the files of the slices cannot be made or written.
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
        stream = self._next_stream()
        assert stream is not None
        try:
            stream.step()
        except BaseException:
            self.abandon()
            raise
        self.held_s = max(self.held_s, stream.held_s)

    def _start(self) -> None:
        """Start noting changes in each large index, make its files and plan its slices."""
        self._sliced = []
        try:
            for si, store in enumerate(self.stores):
                if not self._big[si]:
                    self._sliced.append(None)
                    continue
                mine = self.mine(store)
                if self.staging_dir is None:
                    if self._staging is None:
                        raise CheckpointError("a capture in slices needs a staging directory")
                    self.staging_dir = self._staging()
                stream = StateStream(store, self.staging_dir, self.slice_bytes)
                with store.mutex:
                    t0 = time.perf_counter()
                    _check(store, mine, starting=True)
                    started = [t.index.start_sliced_state(None) for t in mine]
                    self._hold(t0)
                self._sliced.append((stream, [out for out, _ in started]))
                for t, (out, parts) in zip(mine, started):
                    stream.add(t.index, out, parts, f"t{self.tables.index(t)}")
                stream.plan()
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Stop the capture and delete the slices' files; the moment is not taken."""
        for store, sliced in zip(self.stores, self._sliced or []):
            if sliced is not None:
                sliced[0].close()
                with store.mutex:
                    for t in self.mine(store):
                        t.index.abandon_sliced_state()
        self._sliced = [None] * len(self.stores)
        if self.staging_dir is not None and not self.taken:
            shutil.rmtree(self.staging_dir, ignore_errors=True)
        self.taken = True

    def moment(self, directory: Path, previous: Mapping[str, Previous] | None = None) -> Snapshot:
        """Take the checkpoint's moment and install the column streams writing into ``directory``.

        Raises:
            ClosedError: if a table is closed (nothing is captured then).
            CheckpointError: if a store is being checkpointed already, or not :attr:`ready`.
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
            if sliced is None:
                states = [table_state(t, b) for t, b in zip(mine, buffers)]
            else:
                states = [
                    table_state(t, None, sliced[0].moment(t.index, out, b))
                    for t, out, b in zip(mine, sliced[1], buffers)
                ]
            if sliced is not None and self._sliced is not None:
                self._sliced[si] = None  # finished: nothing of it left to abandon
            store.observe(stream)
            self._hold(t0)
        if sliced is not None:
            snap.state_streams.append(sliced[0])
            sliced[0].after_moment()
        snap.stores.append(
            StoreSnapshot(
                store, store_definition(store), state, stream, files, increments, prev, reusable
            )
        )
        for t, st in zip(mine, states):
            snap.tables.append(TableSnapshot(t, si, table_definition(t), st))
