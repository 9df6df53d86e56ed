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


def _check(store: StepStore, tables: list[Table]) -> None:
    """Refuse closed tables and a store another checkpoint streams (lock held).

    Raises:
        ClosedError: if a table is closed.
        CheckpointError: if the store is being checkpointed already.
    """
    for t in tables:
        if t.closed:
            raise ClosedError(f"table {t.name!r} is closed; it cannot be saved")
    if store.guard is not None:
        raise CheckpointError(
            "a checkpoint of this store is being written already; wait for it to finish "
            "before taking another"
        )


def _copy_in_slices(
    store: StepStore, tables: list[Table], buffers: list[Any], snap: Snapshot
) -> list[tuple] | None:
    """For tables whose per-item state exceeds ``SLICED_ABOVE_BYTES``: copy it a slice of
    ``SLICE_BYTES`` per lock hold, the index noting the slots changed meanwhile; returns
    per table what :func:`~rlreplay.core.item_state.finish_sliced_snapshot` finishes at
    the moment (``None``: small, taken whole at the moment).

    Raises:
        ClosedError, CheckpointError: as :func:`_check` (nothing left noting changes).
    """
    if sum(t.index.nbytes() for t in tables) <= SLICED_ABOVE_BYTES:
        return None
    with store.mutex:
        t0 = time.perf_counter()
        _check(store, tables)
        sliced = [item_state.start_sliced_snapshot(t.index, b) for t, b in zip(tables, buffers)]
        snap.held_s = max(snap.held_s, time.perf_counter() - t0)
    try:
        for _, parts in sliced:
            for source, copy, _ in parts:
                step = max(1, SLICE_BYTES // max(1, source[:1].nbytes))
                for a in range(0, len(source), step):
                    with store.mutex:
                        t0 = time.perf_counter()
                        copy[a : a + step] = source[a : a + step]
                        snap.held_s = max(snap.held_s, time.perf_counter() - t0)
    except BaseException:
        with store.mutex:
            for t in tables:
                item_state.abandon_sliced_snapshot(t.index)
        raise
    return [(out, parts) for out, parts in sliced]


def column_files(si: int, store: StepStore) -> dict[str, list[str]]:
    """The file names of store ``si``'s columns, one per chunk of ``store.chunk_rows``."""
    n = len(store.chunk_generations)
    return {
        p: [f"s{si}.c{ci}.k{k:06d}.npy" for k in range(n)]
        for ci, p in enumerate(store.signature.fields)
    }


def capture(
    tables: list[Table], directory: Path, previous: Mapping[str, Previous] | None = None
) -> Snapshot:
    """Take every part's state of ``tables`` and install the column streams that will
    write into ``directory``; for a store in ``previous`` (by identity: the newest
    checkpoint's stores), note the chunks unchanged since.

    Raises:
        ClosedError: if a table is closed (nothing is captured then).
        CheckpointError: if a store is being checkpointed already.
    """
    stores: list[StepStore] = []
    for t in tables:
        if not any(t.store is s for s in stores):
            stores.append(t.store)
    snap = Snapshot(created_unix=time.time())
    try:
        for si, store in enumerate(stores):
            files = column_files(si, store)
            paths = {p: [directory / n for n in names] for p, names in files.items()}
            mine = [t for t in tables if t.store is store]
            # Made before the lock, so that the copies under it write mapped memory.
            buffers = [t.index.state_buffers() for t in mine]
            sliced = _copy_in_slices(store, mine, buffers, snap)
            with store.mutex:
                t0 = time.perf_counter()
                try:
                    _check(store, mine)
                except BaseException:
                    if sliced is not None:
                        for t in mine:
                            item_state.abandon_sliced_snapshot(t.index)
                    raise
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
                store.guard = stream
                snap.held_s = max(snap.held_s, time.perf_counter() - t0)
            for t, st, b in zip(mine, states, buffers):
                if st["index"]["remover"] is None:  # built by finish(), after the moment
                    snap.idle_removers.append((t, st["index"], (b or {}).get("remover")))
            snap.stores.append(
                StoreSnapshot(
                    store,
                    store_definition(store),
                    state,
                    stream,
                    files,
                    increments,
                    prev,
                    reusable,
                )
            )
            for t, st in zip(mine, states):
                snap.tables.append(TableSnapshot(t, si, table_definition(t), st))
    except BaseException:
        snap.release()
        raise
    snap.tables.sort(key=lambda ts: tables.index(ts.table))
    return snap
