"""A save of a table of many items writes their per-item state into its files a slice at
a time, holding a bounded copy of it in memory, and still saves exactly its moment: with
calls between the slices, with a change record past its limit, after a reset between the
slices. Checkpoints of format version 2 (an idle remover's state saved) still restore."""

from __future__ import annotations

import copy
import gc
import json
from pathlib import Path

import numpy as np
import pytest
from checkpoint_ops import CONFIGS, KINDS, only_table, run
from test_checkpoint_sliced_capture import assert_same_state

from rlreplay import Fifo, Prioritized, Table, Uniform, checkpoint
from rlreplay.checkpoint import snapshot
from rlreplay.checkpoint.manifest import write_array
from rlreplay.checkpoint.save import SaveStats, StepwiseSave
from rlreplay.core import idle_remover, slot_changes
from rlreplay.core.selectors import sum_tree


def status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def test_a_save_of_many_items_holds_a_bounded_copy_of_their_state(tmp_path):
    """3 million items (77 MB of per-item state, plus an idle FIFO remover whose order a
    save used to build: 195 MB of extra resident memory in all): the save's peak extra
    resident memory stays under 40 MB, the slice buffers and pieces, whatever the count."""
    clear_refs = Path("/proc/self/clear_refs")
    n = 3_000_000
    table = Table("t", signature={"x": "uint8"}, capacity=n, sampler=Prioritized(0.6), seed=0)
    table.insert({"x": np.zeros(n, np.uint8)}, np.random.default_rng(0).uniform(0.1, 2, n))
    assert table.index.nbytes() > 2 * snapshot.SLICED_ABOVE_BYTES  # taken in slices
    expected = table.index.state()
    del expected["remover"]  # (an idle remover's state is made by state(), never saved)
    gc.collect()
    rss0 = status_kb("VmRSS")
    try:
        clear_refs.write_text("5")  # the peak (VmHWM) starts again from now
    except OSError:
        pytest.skip("this system does not let a process reset its peak resident memory")
    stats = SaveStats()
    path = checkpoint.save(table, tmp_path, stats=stats)
    peak_mb = (status_kb("VmHWM") - rss0) / 1024
    assert stats.state_peak_bytes <= 3 * snapshot.SLICE_BYTES, stats.state_peak_bytes
    assert peak_mb < 40, peak_mb
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format_version"] == 3
    assert manifest["tables"][0]["state"]["index"]["remover"] is None  # idle: not saved
    restored = only_table(path).index.state()
    del restored["remover"]
    assert_same_state(restored, expected)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_a_save_written_slice_by_slice_holds_its_moment_under_every_mutation_path(
    config, tmp_path, monkeypatch
):
    """Calls of every kind between the slices (inserts, writers, samples counting and
    removing items, priority updates, deletes, evictions, a stack's relocations): the
    restored tables hold the state at the moment bit for bit and answer every later call
    as the saved ones do."""
    monkeypatch.setattr(snapshot, "SLICED_ABOVE_BYTES", -1)  # every index in slices
    # every tree level but the root patched by slot (the numpy trees recompute levels of
    # up to WHOLE_LEVEL nodes whole: those are copied whole)
    whole = 1 if sum_tree._kernel is not None else sum_tree.WHOLE_LEVEL
    monkeypatch.setattr(slot_changes, "WHOLE_ENTRIES", whole)
    rng = np.random.default_rng(11)
    ops = [
        (str(rng.choice(KINDS)), int(rng.integers(3)), int(rng.integers(1, 9))) for _ in range(120)
    ]
    tables = CONFIGS[config]()
    memory: dict = {}
    run(tables, ops[:30], memory)
    save = StepwiseSave(tables, tmp_path, slice_bytes=4)
    k = 30
    while not save.capture.ready:
        save.step()
        if k < 90:
            run(tables, [ops[k]], memory)
            k += 1
    save.step()  # the moment
    expected = {name: t.index.state() for name, t in tables.items()}
    restored = checkpoint.restore(save.write(), verify=True)
    assert k > 40  # many calls between the slices
    for name in tables:
        assert_same_state(restored[name].index.state(), expected[name], name)
    after = ops[90:]
    assert run(restored, after, copy.deepcopy(memory)) == run(tables, after, copy.deepcopy(memory))


def stepwise_with_calls(table: Table, path: Path, between=None, slice_bytes: int = 512):
    """Step a save of ``table`` to its moment, one insert, sample and priority update
    (and ``between(step)``) after each step; returns the save, the steps taken and
    ``table.index.state()`` at the moment."""
    rng = np.random.default_rng(2)
    save = StepwiseSave(table, path, slice_bytes=slice_bytes)
    steps = 0
    while not save.capture.ready:
        save.step()
        steps += 1
        table.insert({"x": np.float32(steps)}, float(rng.uniform(0.1, 2)))
        s = table.sample(4)
        table.update_priorities(s.info.keys, rng.uniform(0.1, 2, 4))
        if between is not None:
            between(steps)
    save.step()  # the moment
    assert save.done
    return save, steps, table.index.state()


def prioritized(capacity: int = 5000, filled: int = 3000) -> Table:
    table = Table("t", signature={"x": "float32"}, capacity=capacity, sampler=Prioritized(0.6))
    rng = np.random.default_rng(1)
    table.insert({"x": np.arange(filled, dtype=np.float32)}, rng.uniform(0.1, 2, filled))
    return table


def test_a_change_record_past_its_limit_turns_into_flags_and_the_save_stays_exact(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(snapshot, "SLICED_ABOVE_BYTES", -1)
    monkeypatch.setattr(slot_changes, "LIST_LIMIT", 16)
    table = prioritized()
    kinds = []

    def look(step: int) -> None:
        changes = table.index.changes
        kinds.append(changes.flags is not None)
        # bounded: the flags, never a list of every note
        assert changes.nbytes <= max(8 * (slot_changes.LIST_LIMIT + 8), table.index.capacity)

    save, steps, expected = stepwise_with_calls(table, tmp_path, look)
    assert steps > 20 and kinds[-1] and not kinds[0]  # past the limit: flags
    table.insert({"x": np.float32(-1)}, 5.0)  # after the moment: not in the checkpoint
    restored = only_table(save.write(), verify=True)
    assert_same_state(restored.index.state(), expected)


def test_a_reset_between_the_slices_starts_them_over_and_the_save_holds_the_moment(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(snapshot, "SLICED_ABOVE_BYTES", -1)
    table = prioritized()

    def reset_once(step: int) -> None:
        if step == 5:
            table.store.reset()
            table.insert({"x": np.arange(40, dtype=np.float32)}, np.linspace(0.5, 1, 40))

    quiet, plain_steps, _ = stepwise_with_calls(prioritized(), tmp_path / "plain")
    quiet.abandon()
    save, steps, expected = stepwise_with_calls(table, tmp_path / "reset", reset_once)
    assert steps >= plain_steps + 3  # the slices copied before the reset, again
    restored = only_table(save.write(), verify=True)
    assert_same_state(restored.index.state(), expected)


def test_an_abandoned_capture_leaves_no_files(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot, "SLICED_ABOVE_BYTES", -1)
    table = prioritized()
    save = StepwiseSave(table, tmp_path, slice_bytes=512)
    for _ in range(5):
        save.step()
    assert any(p.name.startswith(".tmp-ckpt-") for p in tmp_path.iterdir())
    save.abandon()
    assert list(tmp_path.iterdir()) == [] and not table.index.changes.tracking
    path = checkpoint.save(table, tmp_path)  # and the next save goes on
    assert only_table(path).size == table.size


def as_version_2(path: Path) -> None:
    """Rewrite the checkpoint at ``path`` as format version 2 wrote it: with its idle
    removers' states saved (the order an active remover would hold)."""
    manifest = json.loads((path / "manifest.json").read_text())
    for i, t in enumerate(manifest["tables"]):
        index = t["state"]["index"]
        if index["remover"] is not None:
            continue
        arrays = {k: np.load(path / index[k]["file"]) for k in ("live", "priority")}
        remover = Table(
            "r", signature={"x": "float32"}, capacity=4, remover=Fifo(), max_size=2
        ).index.remover  # a remover of the table's kind (FIFO here), unbound
        live, priority = arrays["live"], arrays["priority"]
        state = idle_remover.idle_state(remover, live, index["newest"], priority)
        saved = {}
        for key, value in state.items():
            if isinstance(value, np.ndarray):
                name = f"t{i}.index.remover.{key}.npy"
                manifest["files"][name] = write_array(path / name, value)
                saved[key] = {"file": name}
            else:
                saved[key] = value
        index["remover"] = saved
    manifest["format_version"] = 2
    del manifest["manifest_crc32"]  # that version wrote none
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_a_format_version_2_checkpoint_with_its_idle_remover_saved_still_restores(tmp_path):
    full = Table("t", signature={"step": "int64"}, capacity=30, max_size=30, sampler=Uniform())
    full.insert({"step": np.arange(25, dtype=np.int64)})
    full.insert({"step": np.arange(25, 45, dtype=np.int64)})  # wrapped: steps 15..44 held
    path = checkpoint.save(full, tmp_path)
    as_version_2(path)
    assert (path / "t0.index.remover.next.npy").exists()
    again = only_table(path, verify=True)
    assert again.size == 30
    np.testing.assert_array_equal(again.sample(8).info.keys, full.sample(8).info.keys)
    larger = Table("t", signature={"step": "int64"}, capacity=64, max_size=32, sampler=Uniform())
    checkpoint.restore(path, larger, adapt=True)
    assert larger.index.remover_active and larger.size == 30
    larger.insert({"step": np.arange(45, 49, dtype=np.int64)})  # two over max_size
    held = sorted(larger.store.columns["step"][np.flatnonzero(larger.index.live)].tolist())
    assert held == list(range(17, 49))  # the saved order: the two oldest went first


def test_a_reset_between_the_last_slice_and_the_moment_copies_every_part_whole(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(snapshot, "SLICED_ABOVE_BYTES", -1)
    table = prioritized()
    save = StepwiseSave(table, tmp_path, slice_bytes=512)
    while not save.capture.ready:
        save.step()
    table.store.reset()  # every slot changed after its slice was written
    table.insert({"x": np.arange(40, dtype=np.float32)}, np.linspace(0.5, 1, 40))
    save.step()  # the moment
    assert save.done
    expected = table.index.state()
    stats = save.stats
    restored = only_table(save.write(), verify=True)
    assert_same_state(restored.index.state(), expected)
    assert restored.size == 40
    assert stats.state_peak_bytes >= table.index.records.nbytes()  # the whole state, once
