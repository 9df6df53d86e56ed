"""A large index's per-item state is copied a slice per lock hold, the index noting the
slots its mutations change meanwhile, and finished at the moment: the result is the
state at that moment, whatever the calls between the slices did."""

from __future__ import annotations

import copy
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from checkpoint_ops import CONFIGS, KINDS, SIGNATURE, only_table, rows, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlreplay import Prioritized, StepStore, Table, TrajectoryWriter, checkpoint
from rlreplay.checkpoint import snapshot
from rlreplay.checkpoint.save import SaveStats, StepwiseSave
from rlreplay.core import slot_changes
from rlreplay.core.selectors import sum_tree
from rlreplay.errors import CheckpointError

OPS = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, 2), st.integers(1, 9)),
    min_size=1,
    max_size=30,
)


def assert_same_state(got, expected, where="state") -> None:
    assert type(got) is type(expected) or (
        isinstance(got, np.ndarray) and isinstance(expected, np.ndarray)
    ), where
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected), where
        for key in expected:
            assert_same_state(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype and got.shape == expected.shape, where
        assert got.tobytes() == expected.tobytes(), where  # bit for bit
    else:
        assert got == expected, where


def finish_sliced(index, out: dict, parts: list, into: dict) -> dict:
    """The moment of a sliced copy into memory (lock held), as the state files take it:
    the entries the changed slots name copied again, then the rest of the state."""
    slots = index.take_changes()
    for source, copy_, per_entry in parts:
        at = slot_changes.changed_entries(len(source), per_entry, slots)
        if at is None:
            np.copyto(copy_, source)
        elif len(at):
            copy_[at] = source[at]
    return index.finish_scalars(out, into, True)


def sliced_while(tables: dict, during: list | Callable, memory: dict) -> tuple[list, list]:
    """Start a sliced snapshot of every table, copy its parts in three slices each with
    a third of ``during`` applied after each slice (or ``during(k)`` called after slice
    ``k``), and finish it; returns the finished states and ``index.state()`` taken at
    the same moment."""
    if not callable(during):
        ops = during

        def during(k: int) -> None:
            run(tables, ops[k::3], memory)

    names = sorted(tables)
    store = tables[names[0]].store
    buffers = [tables[n].index.state_buffers() for n in names]
    with store.mutex:
        started = [tables[n].index.start_sliced_state(b) for n, b in zip(names, buffers)]
    for k in range(3):
        for _, parts in started:
            for source, out, _ in parts:
                step = -(-len(source) // 3)
                with store.mutex:
                    out[k * step : (k + 1) * step] = source[k * step : (k + 1) * step]
        during(k)
    with store.mutex:
        got = [
            finish_sliced(tables[n].index, out, parts, b)
            for n, (out, parts), b in zip(names, started, buffers)
        ]
        expected = [tables[n].index.state(None, idle_remover_later=True) for n in names]
    assert all(not tables[n].index.changes.tracking for n in names)
    return got, expected


@pytest.mark.parametrize("config", sorted(CONFIGS))
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(before=OPS, during=OPS)
def test_a_sliced_snapshot_is_the_state_at_its_moment(config, before, during):
    """Every mutation path between the slices (inserts one row and batched, evictions
    by the remover and by overwrites, writers, a stack's relocations, samples counting
    and removing items, priority updates, deletes) is copied again at the moment."""
    with pytest.MonkeyPatch.context() as mp:
        # every tree level but the root copied again by slot, not whole (the numpy trees
        # recompute levels of up to WHOLE_LEVEL nodes whole: those stay whole)
        whole = 1 if sum_tree._kernel is not None else sum_tree.WHOLE_LEVEL
        mp.setattr(slot_changes, "WHOLE_ENTRIES", whole)
        tables = CONFIGS[config]()
        memory: dict = {}
        run(tables, before, memory)
        got, expected = sliced_while(tables, during, memory)
    for g, e in zip(got, expected):
        assert_same_state(g, e)


def test_a_stacks_relocations_between_the_slices_are_taken_again(monkeypatch):
    """A writer overwriting rows that a stack's items hold: the overwrite protocol moves
    those items to new slots (detach, attach) while the slices are copied."""
    monkeypatch.setattr(slot_changes, "WHOLE_ENTRIES", 0)
    store = StepStore(SIGNATURE, 48)
    tables = {
        "rows": Table("rows", store=store, sampler=Prioritized(0.5), max_size=30, seed=1),
        "stack": Table.stack("stack", 6, store=store, seed=2),
    }
    tables["rows"].insert(rows(0, 20))
    tables["rows"].insert(rows(20, 20))
    with TrajectoryWriter(tables["stack"]) as w:
        for i in range(4):
            w.append({"step": np.int64(100 + i), "obs": np.zeros(3, np.float32)})
            w.create_item(tables["stack"], start=-1)

    def write(k: int) -> None:  # after the last slice: every change is copied again
        for i in range(2 if k == 2 else 0):
            with TrajectoryWriter([tables["rows"], tables["stack"]]) as w:
                w.append_batch(rows(200 + 30 * i, 24))
                w.create_item(tables["rows"], start=-1, timeout=5)

    relocated = store.overwrite.relocated_steps
    got, expected = sliced_while(tables, write, {})
    assert store.overwrite.relocated_steps > relocated
    for g, e in zip(got, expected):
        assert_same_state(g, e)


def test_a_reset_between_the_slices_takes_every_part_again():
    tables = CONFIGS["prioritized"]()
    memory: dict = {}
    run(tables, [("insert", 0, 9), ("insert", 0, 9), ("sample", 0, 4)], memory)
    reset = [("insert", 0, 5)]
    store = tables["t"].store

    def reset_then_insert(tables, ops, memory):
        store.reset()
        return run(tables, ops, memory)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(slot_changes, "WHOLE_ENTRIES", 0)
        run(tables, [("insert", 0, 3)], memory)
        buffers = tables["t"].index.state_buffers()
        with store.mutex:
            out, parts = tables["t"].index.start_sliced_state(buffers)
        for source, dst, _ in parts:
            dst[:] = source
        reset_then_insert(tables, reset, memory)
        with store.mutex:
            g = finish_sliced(tables["t"].index, out, parts, buffers)
            e = tables["t"].index.state(None, idle_remover_later=True)
    assert_same_state(g, e)
    assert tables["t"].size == 5


def test_a_save_of_a_large_index_holds_the_lock_a_slice_at_a_time_and_restores_exactly(
    tmp_path, monkeypatch
):
    """checkpoint.save copies an index over SLICED_ABOVE_BYTES in slices while another
    thread inserts, samples and updates; the restored table is consistent (every held
    item in the sampler's tree, the tree's total the sum of its leaves) and its longest
    capture hold is one slice's or the moment's, well below the whole copy's."""
    monkeypatch.setattr(snapshot, "SLICED_ABOVE_BYTES", 1 << 20)
    monkeypatch.setattr(snapshot, "SLICE_BYTES", 64 << 10)
    n = 200_000
    table = Table("t", signature={"x": "float32"}, capacity=n, sampler=Prioritized(0.6), seed=0)
    table.insert({"x": np.zeros(n, np.float32)}, np.random.default_rng(0).uniform(0.1, 2, n))
    stop = threading.Event()
    calls = [0]

    def serve() -> None:
        deadline = time.monotonic() + 20
        rng = np.random.default_rng(1)
        while not stop.is_set() and time.monotonic() < deadline:
            table.insert({"x": np.float32(1.0)}, float(rng.uniform(0.1, 2)))
            s = table.sample(8)
            table.update_priorities(s.info.keys, rng.uniform(0.1, 2, 8))
            calls[0] += 1

    worker = threading.Thread(target=serve)
    worker.start()
    try:
        time.sleep(0.02)
        stats = SaveStats()
        path = checkpoint.save(table, tmp_path, stats=stats)
    finally:
        stop.set()
        worker.join(30)
    assert calls[0] > 0
    restored = only_table(path)
    index = restored.index
    leaves = index.sampler.sums.levels[0][:n]
    np.testing.assert_array_equal(index.sampler.held, index.live)
    # (a one-row insert raises to the power in Python, a batch in numpy: an ulp apart)
    np.testing.assert_allclose(leaves, np.where(index.live, index.priority**0.6, 0.0), rtol=1e-14)
    assert index.sampler.sums.root == pytest.approx(leaves.sum(), rel=1e-12)
    whole = table.index.nbytes()
    assert stats.capture_held_s < 0.5  # generous: a shared 2-core machine
    assert whole > 8 * (64 << 10)  # many slices


@pytest.mark.parametrize("config", ["prioritized", "shared_store", "stack"])
def test_a_save_taken_in_slices_restores_every_call_as_the_saved_tables(config, monkeypatch):
    monkeypatch.setattr(snapshot, "SLICED_ABOVE_BYTES", -1)  # every index in slices
    monkeypatch.setattr(snapshot, "SLICE_BYTES", 64)
    rng = np.random.default_rng(5)
    ops = [
        (str(rng.choice(KINDS)), int(rng.integers(3)), int(rng.integers(1, 9))) for _ in range(60)
    ]
    tables = CONFIGS[config]()
    memory: dict = {}
    run(tables, ops[:30], memory)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.save(tables, tmp)
        restored = checkpoint.restore(tmp)
        expected = run(tables, ops[30:], copy.deepcopy(memory))
        got = run(restored, ops[30:], copy.deepcopy(memory))
    assert got == expected


def test_a_stepwise_save_taken_between_calls_holds_its_moment_and_refuses_a_second_capture(
    tmp_path, monkeypatch
):
    """A save whose capture steps are taken between table calls (as a server's dispatcher
    takes them) restores bit for bit the state at its last step; a second save of the
    same index while the first copies it in slices is refused (it would take over the
    slots the index notes for the first) and the first still finishes exactly."""
    monkeypatch.setattr(snapshot, "SLICED_ABOVE_BYTES", -1)
    table = Table("t", signature={"x": "float32"}, capacity=5000, sampler=Prioritized(0.6), seed=0)
    rng = np.random.default_rng(2)
    table.insert({"x": np.arange(3000, dtype=np.float32)}, rng.uniform(0.1, 2, 3000))
    first = StepwiseSave(table, tmp_path / "a", slice_bytes=512)
    steps = 0
    while not first.capture.ready:
        first.step()
        steps += 1
        table.insert({"x": np.float32(steps)}, float(rng.uniform(0.1, 2)))
        s = table.sample(4)
        table.update_priorities(s.info.keys, rng.uniform(0.1, 2, 4))
        if steps == 3:
            second = StepwiseSave(table, tmp_path / "b", slice_bytes=512)
            with pytest.raises(CheckpointError, match="being written already"):
                while not second.done:
                    second.step()
            assert table.index.changes.tracking  # the first's notes are kept
    assert steps > 20  # many slices, calls between them
    first.step()  # the moment
    assert first.done
    expected = table.index.state()
    table.insert({"x": np.float32(-1)}, 5.0)  # after the moment: not in the checkpoint
    restored = only_table(first.write())
    assert_same_state(restored.index.state(), expected)
    assert not table.index.changes.tracking


MOMENT_IN_A_FRESH_PROCESS = """
import sys, tempfile
import numpy as np
from rlreplay import Prioritized, Table
from rlreplay.checkpoint import snapshot
from rlreplay.checkpoint.save import StepwiseSave
from rlreplay.core import slot_changes
snapshot.SLICED_ABOVE_BYTES = -1
slot_changes.WHOLE_ENTRIES = 0  # every tree level copied again by slot
t = Table("t", signature={"x": "float32"}, capacity=4096, sampler=Prioritized(0.6), seed=0)
t.insert({"x": np.zeros(3000, np.float32)}, np.linspace(0.1, 2, 3000))
s = StepwiseSave(t, tempfile.mkdtemp(), slice_bytes=1024)
while not s.capture.ready:
    s.step()
    t.insert({"x": np.float32(1)}, 0.5)
    t.update_priorities(t.sample(4).info.keys, np.full(4, 0.7))
before = set(sys.modules)
s.step()
assert s.done
print(sorted(set(sys.modules) - before))
s.write()
"""


def test_a_sliced_moment_imports_no_module_under_the_lock():
    """``np.unique`` imports ``numpy.ma`` on its first call (5-15 ms): the moment of a
    sliced capture, taken with the store's lock held, must not be where that happens."""
    out = subprocess.run(
        [sys.executable, "-c", MOMENT_IN_A_FRESH_PROCESS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
