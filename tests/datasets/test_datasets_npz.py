"""Columnar datasets (.npz): exact round trips of steps and items, ranges, and refusals
that insert nothing."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from rlreplay import (
    DatasetError,
    Fifo,
    InvalidArgumentError,
    ItemLayout,
    NStepTransitionAdder,
    Prioritized,
    SampleToInsertRatio,
    SignatureError,
    StepStore,
    Table,
    Window,
)
from rlreplay.datasets import table_contents
from rlreplay.datasets.npz import export_npz, import_npz, read_npz_meta
from rlreplay.datasets.table_contents import read_items, step_range

SIG = {"obs": ((3,), "float32"), "action": "int64", "reward": "float32"}


def filled_table(seed: int = 0, **kwargs) -> Table:
    """A prioritized table whose ring has wrapped, sampled a little."""
    kwargs.setdefault("capacity", 64)
    kwargs.setdefault("max_size", 50)
    table = Table("replay", signature=SIG, sampler=Prioritized(0.6), seed=seed, **kwargs)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        table.insert(
            {
                "obs": rng.normal(size=(30, 3)),
                "action": rng.integers(0, 4, 30),
                "reward": rng.normal(size=30),
            },
            priorities=rng.random(30) + 0.1,
        )
    table.sample(8)
    return table


def stored(store: StepStore) -> dict[str, np.ndarray]:
    return store.read(np.arange(store.oldest_id, store.next_id))


def test_npz_round_trip_restores_steps_items_and_priorities_exactly(tmp_path):
    table = filled_table()
    path = export_npz(table, tmp_path / "replay")
    assert path == tmp_path / "replay.npz"
    copy = Table("replay", signature=SIG, capacity=64, max_size=50, sampler=Prioritized(0.6))
    keys = import_npz(path, copy)["replay"]

    for field, column in stored(table.store).items():
        np.testing.assert_array_equal(stored(copy.store)[field], column)
        assert stored(copy.store)[field].dtype == column.dtype
    # the i-th new key names the item made from the i-th exported one
    with np.load(path, allow_pickle=False) as data:
        records = read_items(copy, _span(copy.store))
        np.testing.assert_array_equal(records.keys, keys)
        np.testing.assert_array_equal(records.priorities, data["tables/replay/priority"])
        np.testing.assert_array_equal(records.anchor_ids, data["tables/replay/anchor"])
    again = export_npz(copy, tmp_path / "again.npz")
    with np.load(path, allow_pickle=False) as a, np.load(again, allow_pickle=False) as b:
        for name in a.files:
            if name in ("meta", "tables/replay/key", "tables/replay/times_sampled"):
                continue
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        np.testing.assert_array_equal(b["tables/replay/key"], keys)
        assert not b["tables/replay/times_sampled"].any()  # fresh items
    assert copy.size == table.size == 50
    assert copy.update_priorities(keys[:3], [5.0, 6.0, 7.0]) == 3


def test_npz_is_plain_numpy_readable_without_pickle(tmp_path):
    table = filled_table()
    path = export_npz(table, tmp_path / "d.npz", item_data=True)
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        assert meta["format"] == "rlreplay-columnar" and meta["version"] == 1
        assert data["steps/obs"].shape == (64, 3)
        assert data["tables/replay/data/obs"].shape == (50, 3)
        anchors = data["tables/replay/anchor"]
        np.testing.assert_array_equal(data["tables/replay/data/obs"], data["steps/obs"][anchors])
        assert (np.diff(anchors) > 0).all()  # oldest anchor first
        assert all(data[f].dtype != object for f in data.files)


def shared_tables() -> tuple[Table, Table, NStepTransitionAdder]:
    """An n-step table (per-item extents) and a FIFO sequence table over one store."""
    sig = NStepTransitionAdder.signature(obs=((2,), "float32"), action="int64")
    store = StepStore(sig, capacity=256)
    nstep = Table(
        "nstep",
        store=store,
        layout=NStepTransitionAdder.layout(sig, n=3),
        sampler=Prioritized(1.0),
        max_size=200,
        seed=1,
    )
    seq = Table("seq", store=store, layout=ItemLayout.sequence(sig, 4), remover=Fifo(), seed=2)
    adder = NStepTransitionAdder(nstep, n=3, discount=0.9)
    return nstep, seq, adder


def play(adder: NStepTransitionAdder, seq: Table, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    adder.reset(rng.normal(size=2))
    for t in range(steps):
        done = t % 11 == 10
        adder.add(int(rng.integers(3)), float(rng.normal()), rng.normal(size=2), done, False)
        if done:
            adder.reset(rng.normal(size=2))
    adder.flush()
    store = seq.store
    seq.create_items(np.arange(store.oldest_id, store.next_id - 4, 5))


def test_npz_round_trip_of_several_tables_over_one_store_keeps_each_items_data(tmp_path):
    nstep, seq, adder = shared_tables()
    play(adder, seq, 120, seed=3)
    nstep.update_priorities(nstep.sample(10).info.keys, np.arange(1.0, 11.0))
    path = export_npz([nstep, seq], tmp_path / "shared.npz", item_data=True)

    nstep2, seq2, _ = shared_tables()
    keys = import_npz(path, [nstep2, seq2])
    assert len(keys["nstep"]) == nstep.size and len(keys["seq"]) == seq.size
    again = export_npz([nstep2, seq2], tmp_path / "again.npz", item_data=True)
    with np.load(path, allow_pickle=False) as a, np.load(again, allow_pickle=False) as b:
        for name in a.files:  # extents, priorities and every item's data
            if name.startswith("tables/") and not name.endswith(("/key", "/times_sampled")):
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        assert {n for n in a.files if "/data/" in n} == {
            *(f"tables/nstep/data/{f}" for f in ("obs", "next_obs", "action", "reward",
                                                 "discount")),
            *(f"tables/seq/data/{f}" for f in seq.layout.windows),
        }  # fmt: skip
    # a sample of the imported items reads the data exported with them
    with np.load(path, allow_pickle=False) as data:
        batch = nstep2.sample(5)
        at = np.searchsorted(keys["nstep"], batch.info.keys)
        assert (keys["nstep"][at] == batch.info.keys).all()
        for name in ("obs", "next_obs", "reward", "discount"):
            np.testing.assert_array_equal(batch.data[name], data[f"tables/nstep/data/{name}"][at])


def _span(store: StepStore):
    return step_range(store, None, None)


def test_npz_range_exports_the_steps_between_two_insert_counts_and_items_inside(tmp_path):
    table = Table("t", signature=SIG, max_size=100, layout=ItemLayout.transition(SIG, "obs"))
    steps = {"obs": np.arange(90.0).reshape(30, 3), "action": np.arange(30), "reward": np.ones(30)}
    table.store.append(steps)
    table.create_items(np.arange(0, 29))
    path = export_npz(table, tmp_path / "r.npz", first_id=10, end_id=20)
    with np.load(path, allow_pickle=False) as data:
        np.testing.assert_array_equal(data["steps/action"], np.arange(10, 20))
        # a transition reads its anchor and the next step: anchors 10..18 lie inside
        np.testing.assert_array_equal(data["tables/t/anchor"], np.arange(0, 9))
    copy = Table("t", signature=SIG, max_size=100, layout=ItemLayout.transition(SIG, "obs"))
    assert len(import_npz(path, copy)["t"]) == 9
    batch = copy.sample(8).data
    np.testing.assert_array_equal(batch["next_obs"] - batch["obs"], np.full((8, 3), 3.0))


@pytest.mark.parametrize(
    "first_id, end_id",
    [(-1, None), (None, 91), (20, 10), (1.5, None), (True, None)],
)
def test_npz_range_outside_the_stored_steps_is_refused(tmp_path, first_id, end_id):
    table = filled_table(capacity=128, max_size=100)  # holds ids [0, 90)
    with pytest.raises(InvalidArgumentError) as info:
        export_npz(table, tmp_path / "x.npz", first_id=first_id, end_id=end_id)
    assert "first_id" in str(info.value) or "end_id" in str(info.value)
    assert not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize(
    "path, message",
    [
        ("no/such/x.npz", "the folder 'no/such' does not exist"),
        ("folder.npz", "is a directory"),
        (3, "must be the path of the .npz file"),
        ("", "must be the path of the .npz file"),
    ],
)
def test_npz_export_to_a_path_it_cannot_write_is_refused_first(tmp_path, monkeypatch, path,
                                                                message):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder.npz").mkdir()
    with pytest.raises(InvalidArgumentError, match=message):
        export_npz(filled_table(), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.npz"]


def test_npz_of_a_lanes_store_keeps_lanes_and_refuses_another(tmp_path):
    store = StepStore(SIG, capacity=40, lanes=2)
    table = Table("t", store=store, layout=ItemLayout.sequence(SIG, 3), max_size=40)
    store.append({"obs": np.zeros((20, 3)), "action": np.arange(20), "reward": np.ones(20)})
    table.create_items(np.arange(0, 14))
    with pytest.raises(InvalidArgumentError, match="lanes"):
        export_npz(table, tmp_path / "odd.npz", first_id=1)
    path = export_npz(table, tmp_path / "lanes.npz", first_id=2)
    copy = Table("t", store=StepStore(SIG, 40, lanes=2), layout=ItemLayout.sequence(SIG, 3))
    assert len(import_npz(path, copy)["t"]) == 12
    np.testing.assert_array_equal(stored(copy.store)["action"], np.arange(2, 20))
    one_lane = Table("t", signature=SIG, max_size=40, layout=ItemLayout.sequence(SIG, 3))
    with pytest.raises(DatasetError, match="lanes=2"):
        import_npz(path, one_lane)
    assert one_lane.store.next_id == 0


SIGNATURE_CASES = {
    "dtype": ({**SIG, "action": "int32"}, "'action'.*int64.*int32"),
    "shape": ({**SIG, "obs": ((4,), "float32")}, r"'obs'.*\(3,\).*\(4,\)"),
    "missing column": ({"obs": ((3,), "float32"), "action": "int64"}, "'reward'.*lacks"),
    "extra column": ({**SIG, "done": "bool"}, r"\['done'\].*lacks"),
}


@pytest.mark.parametrize("case", list(SIGNATURE_CASES))
def test_npz_import_into_another_signature_is_refused_naming_the_column(tmp_path, case):
    path = export_npz(filled_table(), tmp_path / "d.npz")
    signature, pattern = SIGNATURE_CASES[case]
    other = Table("replay", signature=signature, max_size=50, capacity=64)
    other.insert(
        {p: np.zeros((2, *s.shape), s.dtype) for p, s in other.store.signature.fields.items()}
    )
    with pytest.raises(SignatureError, match=pattern) as info:
        import_npz(path, other)
    assert "build the table with the dataset's signature" in str(info.value)
    assert other.store.next_id == 2 and other.size == 2  # nothing inserted
    # what the message says to do works
    fixed = Table("replay", signature=read_npz_meta(path)["signature"], max_size=50, capacity=64)
    assert len(import_npz(path, fixed)["replay"]) == 50


def test_npz_import_refusals_insert_nothing(tmp_path):
    path = export_npz(filled_table(), tmp_path / "d.npz")
    cases = [
        (Table("other", signature=SIG, capacity=64, max_size=50), "no items of table 'other'"),
        (Table("replay", signature=SIG, capacity=32, max_size=32), "capacity=32"),
        (Table("replay", signature=SIG, capacity=64, max_size=20), "max_size=20"),
        (
            Table("replay", signature=SIG, capacity=64, layout=ItemLayout.sequence(SIG, 2)),
            "layout",
        ),
        (
            Table(
                "replay",
                signature=SIG,
                capacity=64,
                rate_limiter=SampleToInsertRatio(1.0, 1, 5.0),
            ),
            "rate limiter",
        ),
    ]
    for table, pattern in cases:
        with pytest.raises(DatasetError, match=pattern):
            import_npz(path, table)
        assert table.store.next_id == 0 and table.size == 0


def test_npz_import_of_a_file_with_bad_priorities_appends_no_steps(tmp_path):
    path = export_npz(filled_table(), tmp_path / "d.npz")
    with np.load(path, allow_pickle=False) as data:
        arrays = dict(data)
    arrays["tables/replay/priority"] = -arrays["tables/replay/priority"] - 1.0
    np.savez(tmp_path / "damaged.npz", **arrays)
    table = Table("replay", signature=SIG, capacity=64, max_size=50)
    with pytest.raises(DatasetError, match=r"tables/replay/priority .*damaged"):
        import_npz(tmp_path / "damaged.npz", table)
    assert table.store.next_id == 0 and table.size == 0


def sequence_table(length: int, padded: bool) -> Table:
    """A table of ``length``-step sequence items (per-item extents when ``padded``)."""
    window = Window("x", 0, length, pad=padded)
    layout = ItemLayout({"x": window}, {"x": "float32"}, mask_field="mask" if padded else None)
    return Table("seq", signature={"x": "float32"}, capacity=16, layout=layout, max_size=16)


def damage_extents(arrays: dict) -> None:
    """One-step extents, the last item moved to the last step (its layout reads 3)."""
    arrays["tables/seq/extent"][:] = 1
    arrays["tables/seq/anchor"][-1] = len(arrays["steps/x"]) - 1


def damage_anchors(arrays: dict) -> None:
    """Two items anchored on one step."""
    arrays["tables/seq/anchor"][1] = arrays["tables/seq/anchor"][0]


def damage_padded_extent(arrays: dict) -> None:
    """An item covering no step."""
    arrays["tables/seq/extent"][0] = 0


def damage_extent_count(arrays: dict) -> None:
    """One extent fewer than items."""
    arrays["tables/seq/extent"] = arrays["tables/seq/extent"][:-1]


DAMAGED_ITEMS = {
    "extents other than the layout's span": (False, damage_extents, "cover \\[1\\] steps"),
    "two items on one step": (False, damage_anchors, "one step twice"),
    "a padded item of no step": (True, damage_padded_extent, "between 1 and 3 steps"),
    "extents not one per item": (True, damage_extent_count, "not one int of each per item"),
}


@pytest.mark.parametrize("case", list(DAMAGED_ITEMS))
def test_npz_import_of_damaged_items_is_refused_before_any_step_is_appended(tmp_path, case):
    """Items that create_items would refuse are refused by the import's own checks, before
    the steps are appended (a failed import inserts nothing) and as a DatasetError."""
    padded, damage, pattern = DAMAGED_ITEMS[case]
    source = sequence_table(3, padded)
    source.store.append({"x": np.arange(10, dtype=np.float32)})
    lengths = np.array([3, 3, 2, 1]) if padded else None
    source.create_items(np.array([0, 2, 4, 7]), lengths=lengths)
    path = export_npz(source, tmp_path / "d.npz")
    with np.load(path, allow_pickle=False) as data:
        arrays = dict(data)
    damage(arrays)
    np.savez(tmp_path / "damaged.npz", **arrays)
    table = sequence_table(3, padded)
    with pytest.raises(DatasetError, match=f"{pattern}.*damaged"):
        import_npz(tmp_path / "damaged.npz", table)
    assert table.store.next_id == 0 and table.size == 0
    assert len(import_npz(path, table)["seq"]) == 4  # the undamaged file imports


def test_npz_import_does_not_overwrite_a_queues_unconsumed_items(tmp_path):
    path = export_npz(filled_table(), tmp_path / "d.npz")
    store = StepStore(SIG, capacity=64)
    queue = Table.queue("q", 64, store=store)
    replay = Table("replay", store=store, max_size=50)
    queue.insert(
        {"obs": np.zeros((10, 3)), "action": np.zeros(10, np.int64), "reward": np.zeros(10)}
    )
    with pytest.raises(DatasetError, match="queue"):
        import_npz(path, replay)
    assert store.next_id == 10 and queue.size == 10 and replay.size == 0
    queue.sample(10)
    assert len(import_npz(path, replay)["replay"]) == 50


def test_npz_import_of_other_files_is_refused(tmp_path):
    table = Table("replay", signature=SIG, capacity=64, max_size=50)
    np.savez(tmp_path / "plain.npz", x=np.zeros(3))
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(DatasetError, match="not an rlreplay columnar dataset"):
        import_npz(tmp_path / "plain.npz", table)
    with pytest.raises(DatasetError, match=r"not an \.npz archive") as caught:
        import_npz(tmp_path / "text.npz", table)
    assert "pickle" not in str(caught.value)  # numpy's advice for such files is unsafe
    np.save(tmp_path / "array.npy", np.zeros(3))  # a single-array file, not an archive
    with pytest.raises(DatasetError, match=r"not an \.npz archive"):
        import_npz(tmp_path / "array.npy", table)
    with pytest.raises(DatasetError, match="cannot be read"):
        import_npz(tmp_path / "missing.npz", table)
    meta = {"format": "rlreplay-columnar", "version": 99}
    np.savez(tmp_path / "future.npz", meta=np.array(json.dumps(meta)))
    with pytest.raises(DatasetError, match="version 99"):
        import_npz(tmp_path / "future.npz", table)
    assert table.store.next_id == 0


def test_npz_steps_only_into_a_store(tmp_path):
    path = export_npz(filled_table(), tmp_path / "d.npz")
    store = StepStore(SIG, capacity=64)
    assert import_npz(path, store) == {}
    np.testing.assert_array_equal(stored(store)["obs"], stored(filled_table().store)["obs"])


def test_npz_export_while_a_writer_inserts_is_one_consistent_snapshot(tmp_path):
    sig = {"step": "int64", "obs": ((3,), "float32")}
    table = Table("t", signature=sig, capacity=256, max_size=200, sampler=Prioritized(1.0))
    stop = threading.Event()

    def write() -> None:
        for batch in range(2000):  # bounded; each row carries its own step id
            if stop.is_set():
                return
            ids = np.arange(batch * 8, batch * 8 + 8)
            table.insert({"step": ids, "obs": np.repeat(ids[:, None], 3, 1)}, ids % 7 + 1.0)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for k in range(5):
            path = export_npz(table, tmp_path / f"snap{k}.npz")
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                steps = data["steps/step"]
                np.testing.assert_array_equal(steps, np.arange(meta["first_id"], meta["end_id"]))
                anchors = data["tables/t/anchor"]
                np.testing.assert_array_equal(data["tables/t/priority"], steps[anchors] % 7 + 1.0)
    finally:
        stop.set()
        writer.join(timeout=30)
    assert not writer.is_alive()


@pytest.mark.parametrize("lanes", [1, 2])
def test_steps_copied_in_small_chunks_equal_one_copy_across_the_ring_wrap(monkeypatch, lanes):
    store = StepStore(SIG, capacity=60, lanes=lanes)
    for first in range(0, 100, 20):  # wraps the ring
        ids = np.arange(first, first + 20)
        store.append({"obs": np.repeat(ids[:, None], 3, 1), "action": ids, "reward": ids})
    monkeypatch.setattr(table_contents, "CHUNK_BYTES", 7 * 24)  # a few rows per lock hold
    span, steps, _ = table_contents.read_steps(store, None, None)
    ids = np.arange(store.oldest_id, store.next_id)
    assert (span.first_id, span.end_id) == (40, 100)
    for field, column in store.read(ids).items():
        np.testing.assert_array_equal(steps[field], column)


def test_steps_overwritten_before_they_are_copied_are_refused(monkeypatch):
    store = StepStore(SIG, capacity=40)
    rows = {"obs": np.zeros((40, 3)), "action": np.arange(40), "reward": np.zeros(40)}
    store.append(rows)
    monkeypatch.setattr(table_contents, "CHUNK_BYTES", 10 * 24)  # 10 rows per lock hold
    copy_chunk = table_contents._copy_chunk

    def lapped(*args):  # a writer appends between the first and the second hold
        end = copy_chunk(*args)
        if end == 10:
            store.append({k: v[:15] for k, v in rows.items()})
        return end

    monkeypatch.setattr(table_contents, "_copy_chunk", lapped)
    with pytest.raises(InvalidArgumentError, match=r"no longer all stored"):
        table_contents.read_steps(store, None, None)
