"""Restoring into tables the user built: definitions checked, differences refused or
adapted (adapt=True), and a refused restore changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
from checkpoint_ops import only_table

from rlreplay import (
    CheckpointMismatchError,
    Fifo,
    InvalidArgumentError,
    ItemLayout,
    MinSize,
    Prioritized,
    SampleToInsertRatio,
    StepStore,
    Table,
    TrajectoryWriter,
    Uniform,
    checkpoint,
)

SIG = {"step": "int64", "obs": ((3,), "float32")}


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"step": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)}


def build(**changes) -> Table:
    kwargs = {
        "signature": SIG,
        "capacity": 40,
        "max_size": 30,
        "sampler": Prioritized(0.6),
        "remover": Fifo(),
        "rate_limiter": MinSize(2),
        "seed": 11,
    }
    kwargs.update(changes)
    return Table("t", **kwargs)


def saved(tmp_path):
    table = build()
    table.insert(rows(0, 25), np.linspace(0.5, 3.0, 25))
    table.insert(rows(25, 25), np.linspace(1.0, 2.0, 25))  # wrapped
    table.sample(7)
    return table, checkpoint.save(table, tmp_path)


def test_restoring_into_a_table_built_alike_continues_exactly(tmp_path):
    table, path = saved(tmp_path)
    fresh = build()
    fresh.insert(rows(500, 3))  # what it held before is replaced
    assert checkpoint.restore(path, fresh) == {fresh.name: fresh}
    a, b = table.sample(16), fresh.sample(16)
    np.testing.assert_array_equal(a.info.keys, b.info.keys)
    np.testing.assert_array_equal(a.data["obs"], b.data["obs"])
    assert table.update_priorities(a.info.keys, np.ones(16)) == fresh.update_priorities(
        b.info.keys, np.ones(16)
    )


MISMATCHES = {
    # name: (changes, adaptable)
    "signature": ({"signature": {"step": "int64", "obs": ((4,), "float32")}}, False),
    "sampler_type": ({"sampler": Uniform()}, False),
    "max_times_sampled": ({"max_times_sampled": 2}, False),
    "on_overwrite": ({"on_overwrite": "block"}, False),
    "capacity": ({"capacity": 64}, True),
    "max_size": ({"max_size": 35}, True),
    "rate_limiter": ({"rate_limiter": SampleToInsertRatio(1.0, 2, 10.0)}, True),
    "priority_exponent": ({"sampler": Prioritized(0.9)}, True),
}


@pytest.mark.parametrize("name", sorted(MISMATCHES))
def test_a_different_definition_is_refused_naming_it_and_changes_nothing(tmp_path, name):
    changes, adaptable = MISMATCHES[name]
    _, path = saved(tmp_path)
    other = build(**changes)
    width = other.store.signature["obs"].shape[0]
    other.insert({"step": np.arange(4), "obs": np.ones((4, width), np.float32)})
    before = {p: c.copy() for p, c in other.store.columns.items()}
    with pytest.raises(CheckpointMismatchError, match=name.split("_")[0]) as err:
        checkpoint.restore(path, other)
    assert ("adapt=True takes this" in str(err.value)) == adaptable
    if not adaptable:
        with pytest.raises(CheckpointMismatchError, match="cannot be adapted"):
            checkpoint.restore(path, other, adapt=True)
    assert other.size == 4 and other.store.next_id == 4
    for p, c in other.store.columns.items():
        np.testing.assert_array_equal(c, before[p])


def test_a_different_signature_names_the_field_that_differs(tmp_path):
    _, path = saved(tmp_path)
    other = build(signature={"step": "int64", "obs": ((4,), "float32"), "extra": "int8"})
    with pytest.raises(CheckpointMismatchError) as err:
        checkpoint.restore(path, other)
    message = str(err.value)
    assert "signature['obs']: checkpoint {'shape': [3]" in message
    assert "'shape': [4]" in message
    assert "signature['extra']: checkpoint absent" in message
    assert "signature['step']" not in message  # the fields that agree are not listed


@pytest.mark.parametrize("name", ["max_size", "rate_limiter", "priority_exponent", "capacity"])
def test_adapt_takes_an_adaptable_difference_keeping_every_item(tmp_path, name):
    table, path = saved(tmp_path)
    other = build(**MISMATCHES[name][0])
    checkpoint.restore(path, other, adapt=True)
    assert other.size == table.size
    assert other.rate_limiter.inserts == table.rate_limiter.inserts
    assert other.rate_limiter.samples == table.rate_limiter.samples
    # The same items with the same data and priorities, wherever they now live.
    want = {int(s): p for s, p in zip(*_items(table))}
    got = {int(s): p for s, p in zip(*_items(other))}
    assert got == want
    if name == "rate_limiter":
        assert other.rate_limiter.config() == SampleToInsertRatio(1.0, 2, 10.0).config()


def _items(table: Table) -> tuple[np.ndarray, np.ndarray]:
    """Each held item's step (its data) and priority."""
    slots = np.flatnonzero(table.index.live)
    steps = table.store.columns["step"][slots]
    return steps, table.index.priority[slots]


@pytest.mark.parametrize(
    "flag", [{"adapt": "no"}, {"mmap": 1}, {"progress": "yes"}, {"verify": "no"}]
)
def test_restore_flags_that_are_not_bools_are_refused_before_anything_changes(tmp_path, flag):
    saved(tmp_path)
    into = build(capacity=80, max_size=60)
    ((name, value),) = flag.items()
    with pytest.raises(InvalidArgumentError, match=f"{name}={value!r} must be True"):
        checkpoint.restore(tmp_path, into, **flag)  # "no" would have counted as true
    assert into.size == 0


def test_a_larger_capacity_keeps_the_order_and_refuses_keys_from_before(tmp_path):
    table, path = saved(tmp_path)
    old_keys = table.sample(4).info.keys
    bigger = build(capacity=64, sampler=Fifo())
    table_fifo = build(sampler=Fifo())
    table_fifo.insert(rows(0, 25))
    table_fifo.insert(rows(25, 25))
    path = checkpoint.save(table_fifo, tmp_path / "fifo")
    checkpoint.restore(path, bigger, adapt=True)
    # FIFO order by step, and the data of each item read from its new row.
    got = bigger.sample(30).data["step"]
    np.testing.assert_array_equal(got, table_fifo.sample(30).data["step"])
    bigger.insert(rows(50, 30))  # writes go on after the moved steps
    with pytest.raises(InvalidArgumentError, match="not keys of this table"):
        bigger.update_priorities(old_keys, np.ones(4))


def test_adapting_to_sizes_that_cannot_hold_what_was_saved_is_refused(tmp_path):
    _, path = saved(tmp_path)
    with pytest.raises(CheckpointMismatchError, match="max_size of at least 30"):
        checkpoint.restore(path, build(max_size=10), adapt=True)
    with pytest.raises(CheckpointMismatchError, match="capacity of at least 40"):
        checkpoint.restore(path, build(capacity=32, max_size=30), adapt=True)


def test_tables_over_one_store_are_restored_into_tables_over_one_store(tmp_path):
    def pair(store_for_second=None):
        store = StepStore(SIG, 40)
        a = Table("a", store=store, max_size=20, seed=1)
        b = Table.queue("b", 8, store=store_for_second or store, seed=2)
        return a, b

    a, b = pair()
    a.insert(rows(0, 10))
    b.insert(rows(10, 5))
    path = checkpoint.save([a, b], tmp_path)
    restored = checkpoint.restore(path)
    assert restored["a"].store is restored["b"].store
    assert restored["b"].sample(5).data["step"].tolist() == [10, 11, 12, 13, 14]
    # Into tables built alike (over one store): fine; over two stores: refused.
    a2, b2 = pair()
    checkpoint.restore(path, {"a": a2, "b": b2})
    assert a2.size == 10 and b2.size == 5
    a3, b3 = pair(StepStore(SIG, 40))
    with pytest.raises(CheckpointMismatchError, match="shares a store"):
        checkpoint.restore(path, [a3, b3])
    # A table left out while another table uses its store: refused, changes nothing.
    a4, _b4 = pair()
    with pytest.raises(CheckpointMismatchError, match=r"\['b'\] use the store"):
        checkpoint.restore(path, [a4])
    assert a4.size == 0
    with pytest.raises(CheckpointMismatchError, match="not in the checkpoint"):
        checkpoint.restore(path, [Table("zzz", signature=SIG, max_size=4)])


def test_restore_gives_each_of_several_tables_by_name(tmp_path):
    a = Table("a", signature=SIG, max_size=8, seed=1)
    b = Table("b", signature=SIG, max_size=8, seed=2)
    b.insert(rows(0, 3))
    path = checkpoint.save([a, b], tmp_path)
    tables = checkpoint.restore(path)
    assert sorted(tables) == ["a", "b"]
    assert (tables["a"].size, tables["b"].size) == (0, 3)


def test_a_writer_open_during_a_checkpoint_has_its_items_and_steps_saved(tmp_path):
    """What is saved of an open writer: the steps it appended and the items it created
    before the moment; its retained episode steps are not a writer in the restored
    table (a new writer starts a new episode), and the open writer goes on."""
    layout = ItemLayout.transition(SIG, next_fields="obs")
    table = Table("tr", signature=SIG, capacity=32, max_size=16, layout=layout, seed=5)
    with TrajectoryWriter(table) as writer:
        for i in range(5):
            writer.append({"step": np.int64(i), "obs": np.full(3, i, np.float32)})
            if i:
                writer.create_item(table, start=-2)
        path = checkpoint.save(table, tmp_path)
        writer.append({"step": np.int64(5), "obs": np.full(3, 5, np.float32)})
        writer.create_item(table, start=-2)  # the open writer goes on after the save
    restored = only_table(path)
    assert restored.size == 4 and restored.store.next_id == 5
    data = restored.sample(16).data
    np.testing.assert_array_equal(data["next_obs"][:, 0], data["step"] + 1)
    with TrajectoryWriter(restored) as writer:  # a new writer, a new episode
        writer.append({"step": np.int64(50), "obs": np.zeros(3, np.float32)})
        writer.append({"step": np.int64(51), "obs": np.ones(3, np.float32)})
        writer.create_item(restored, start=-2)
    assert restored.size == 5 and table.size == 5


def test_a_closed_table_is_not_restored_into(tmp_path):
    from rlreplay import ClosedError

    _, path = saved(tmp_path)
    closed = build()
    closed.close()
    with pytest.raises(ClosedError, match="closed"):
        checkpoint.restore(path, closed)


def test_a_store_of_several_lanes_round_trips(tmp_path):
    store = StepStore(SIG, 24, lanes=2)
    table = Table("lanes", store=store, max_size=20, sampler=Prioritized(1.0), seed=4)
    for first in range(0, 40, 8):
        table.insert(rows(first, 8), np.arange(1.0, 9.0))
    restored = only_table(checkpoint.save(table, tmp_path))
    assert restored.store.lanes == 2 and restored.store.next_id == store.next_id
    a, b = table.sample(12), restored.sample(12)
    np.testing.assert_array_equal(a.info.keys, b.info.keys)
    np.testing.assert_array_equal(a.data["step"], b.data["step"])


def test_a_full_tables_idle_remover_restores_into_a_larger_table_oldest_first(tmp_path):
    full = build(capacity=30, max_size=30, sampler=Uniform(), remover=Fifo())
    assert not full.index.remover_active  # never asked for victims: idle
    full.insert(rows(0, 20))
    full.insert(rows(20, 20))  # wrapped: steps 10..39 held
    larger = build(capacity=64, max_size=32, sampler=Uniform(), remover=Fifo())
    checkpoint.restore(checkpoint.save(full, tmp_path), larger, adapt=True)
    assert larger.index.remover_active and larger.size == 30
    larger.insert(rows(40, 4))  # two over max_size: the two oldest go
    held = sorted(larger.store.columns["step"][np.flatnonzero(larger.index.live)].tolist())
    assert held == list(range(12, 44))
