"""The column files hold the columns as of the checkpoint's moment, whatever is written
while they stream: every write path copies aside the rows it is about to change."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from checkpoint_ops import only_table

from rlreplay import Fifo, MaxHeap, StepStore, Table, TrajectoryWriter, checkpoint
from rlreplay.checkpoint import streaming
from rlreplay.checkpoint.streaming import ColumnStream
from rlreplay.core import idle_remover

SIG = {"step": "int64", "obs": ((3,), "float32")}
ROW_BYTES = 8 + 12


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"step": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)}


class Feeder:
    """Writes between chunks: each call of the stream's progress callback writes the
    next batch of the plan (its sizes cycle), as another thread would."""

    def __init__(self, write, sizes: list[int], calls: int):
        self.write, self.sizes, self.calls, self.n, self.next = write, sizes, calls, 0, 1000

    def __call__(self, _nbytes: int) -> None:
        if self.n < self.calls:
            size = self.sizes[self.n % len(self.sizes)]
            self.write(self.next, size)
            self.next += size
            self.n += 1


def stream_while(store: StepStore, tmp_path, feeder: Feeder, chunk_rows: int = 5, skip: tuple = ()):
    """Stream ``store``'s columns with ``feeder`` writing between pieces, leaving out the
    file chunks ``skip``; returns the columns as they were at the moment and as the
    files hold them (the rows of skipped chunks left out of both)."""
    n = len(store.chunk_generations)
    files = {p: [tmp_path / f"c{i}.{k}.npy" for k in range(n)] for i, p in enumerate(store.columns)}
    with store.mutex:
        moment = {p: c.copy() for p, c in store.columns.items()}
        stream = ColumnStream(store, files, chunk_bytes=chunk_rows * ROW_BYTES)
        store.observe(stream)
    stream.skip(np.array(skip, np.int64))
    try:
        stream.write(feeder)
    finally:
        store.unobserve(stream)
    kept = [k for k in range(n) if k not in skip]
    fr = store.chunk_rows
    rows_kept = np.concatenate([np.arange(k * fr, min(store.capacity, (k + 1) * fr)) for k in kept])
    saved = {
        p: np.concatenate([np.load(f[k], allow_pickle=False) for k in kept])
        for p, f in files.items()
    }
    assert not any(f[k].exists() for f in files.values() for k in skip)
    return {p: c[rows_kept] for p, c in moment.items()}, saved, stream


@pytest.fixture(params=["one_file", "chunk_files_of_8_rows"])
def file_chunks(request, monkeypatch):
    """Columns written as one file each, or as files of 8 rows (stores made after)."""
    if request.param == "chunk_files_of_8_rows":
        from rlreplay.core import store_changes

        monkeypatch.setattr(store_changes, "CHECKPOINT_CHUNK_ALIGN", 1)
        monkeypatch.setattr(store_changes, "CHECKPOINT_CHUNK_BYTES", 8 * ROW_BYTES)
    return request.param


def one_table(capacity: int = 40) -> Table:
    table = Table("t", signature=SIG, max_size=capacity, seed=0)
    table.insert(rows(0, capacity))
    table.insert(rows(capacity, capacity // 2))  # wrapped: the moment's start is mid-ring
    return table


CASES = {
    # one-row inserts: the store's write of one step (compiled)
    "one_row_inserts": ([1], 16),
    # batches that do not wrap (one compiled call) and ones that do (the numpy write)
    "batches": ([3, 7, 11], 12),
    # more than the capacity written before the stream ends: rows overwritten twice
    "lapping_the_ring": ([13], 16),
}


@pytest.mark.parametrize("skip", [(), (1, 3)], ids=["all_chunks", "chunks_1_3_skipped"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_inserts_during_the_stream_leave_the_moment_in_the_files(case, skip, file_chunks, tmp_path):
    sizes, calls = CASES[case]
    table = one_table()
    if len(table.store.chunk_generations) == 1 and skip:
        pytest.skip("one file chunk: nothing to skip")
    feeder = Feeder(lambda first, n: table.insert(rows(first, n)), sizes, calls)
    moment, saved, stream = stream_while(table.store, tmp_path, feeder, skip=skip)
    # the writes really happened during the stream (one per piece written)
    assert feeder.n == calls if not skip else feeder.n >= 8
    for path in moment:
        np.testing.assert_array_equal(saved[path], moment[path])
    assert not np.array_equal(table.store.columns["step"], moment["step"])
    assert stream.aside_peak_bytes > 0


def test_writes_through_the_overwrite_protocol_and_a_writer_leave_the_moment(file_chunks, tmp_path):
    store = StepStore(SIG, 48)
    rows_table = Table("rows", store=store, max_size=30, seed=1)
    stack = Table.stack("stack", 6, store=store, seed=2)  # relocates its items' steps
    rows_table.insert(rows(0, 20))
    rows_table.insert(rows(20, 20))
    with TrajectoryWriter(stack) as w:
        for i in range(4):
            w.append({"step": np.int64(100 + i), "obs": np.zeros(3, np.float32)})
            w.create_item(stack, start=-1)

    def write(first: int, n: int) -> None:
        with TrajectoryWriter([rows_table, stack]) as w:
            w.append_batch(rows(first, n))
            w.create_item(rows_table, start=-1)

    moment, saved, _ = stream_while(store, tmp_path, Feeder(write, [5, 9], 10))
    assert store.overwrite.relocated_steps > 0
    for path in moment:
        np.testing.assert_array_equal(saved[path], moment[path])


def test_a_store_reset_during_the_stream_leaves_the_moment(file_chunks, tmp_path):
    table = one_table()
    calls = []

    def write(first: int, n: int) -> None:
        if not calls:
            table.store.reset()
        calls.append(n)
        table.insert(rows(first, n))

    moment, saved, _ = stream_while(table.store, tmp_path, Feeder(write, [4], 6))
    assert len(calls) == 6
    for path in moment:
        np.testing.assert_array_equal(saved[path], moment[path])


def test_a_save_while_another_thread_inserts_restores_the_moment_it_took(tmp_path, monkeypatch):
    """Integration: checkpoint.save in one thread, inserts in another; the restored
    table equals the table as of the save's moment (rows consistent, items and steps)."""
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 64 * ROW_BYTES)
    table = Table("t", signature=SIG, max_size=4000, remover=Fifo(), seed=0)
    table.insert(rows(0, 4000))
    stop = threading.Event()
    inserted = [4000]

    def insert_forever() -> None:
        deadline = time.monotonic() + 20
        while not stop.is_set() and time.monotonic() < deadline:
            table.insert(rows(inserted[0], 7))
            inserted[0] += 7

    worker = threading.Thread(target=insert_forever)
    worker.start()
    try:
        time.sleep(0.01)
        path = checkpoint.save(table, tmp_path)
    finally:
        stop.set()
        worker.join(30)
    restored = only_table(path)
    cols = restored.store.columns
    np.testing.assert_array_equal(cols["obs"], np.repeat(cols["step"][:, None], 3, axis=1))
    # The saved steps are one contiguous run of ids ending at the moment's next id.
    next_id = restored.store.next_id
    ids = np.sort(cols["step"])
    np.testing.assert_array_equal(ids, np.arange(next_id - 4000, next_id))
    np.testing.assert_array_equal(cols["step"] % 4000, np.arange(4000))
    assert restored.size == 4000 and inserted[0] > next_id  # inserts went on during the save


def test_a_saves_moment_does_not_wait_for_the_idle_removers_index_build(tmp_path):
    """start_save (a server's dispatcher) returns once the per-item state is copied; a
    full table's idle remover (here a heap: its order an O(n log n) build) keeps no
    state and none is saved, so no save waits for that build (a restore into a table
    whose remover is active makes it, see test_checkpoint_state_memory.py)."""
    n = 1_000_000
    table = Table("full", signature={"x": "float32"}, capacity=n, remover=MaxHeap(), seed=0)
    table.insert({"x": np.zeros(n, np.float32)}, np.random.default_rng(0).uniform(0.1, 2, n))
    assert not table.index.remover_active  # full at capacity: the remover is idle
    builds, moments = [], []
    buffers = table.index.state_buffers()  # as the capture does: copies into written memory
    state = table.index.state(buffers, idle_remover_later=True)
    for _ in range(5):
        start = time.perf_counter()
        idle_remover.idle_state(  # what a restore into an active remover makes
            table.index.remover,
            state["live"],
            state["newest"],
            state["priority"],
            buffers.get("remover"),
        )
        builds.append(time.perf_counter() - start)
        start = time.perf_counter()
        pending = checkpoint.start_save(table, tmp_path, keep=1)
        moments.append(time.perf_counter() - start)
        pending.result(60.0)
    # each save next to a build, under the same load: the moment takes a fraction of it
    ratios = sorted(m / b for m, b in zip(moments, builds))
    assert ratios[len(ratios) // 2] < 0.7, (moments, builds)
    assert only_table(tmp_path).size == n
