"""The fast paths of a hand-over's eviction and claim agree with the general ones.

A writer's hand-over evicts the items on a range of rows (one chain of the insertion
order, given in list order) and claims items on scattered slots; these tests compare the
short cuts taken there with what the selectors and the item index must end up holding.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay.core.selectors.fifo import NIL, Fifo, Lifo


def _linked(sel: Fifo) -> list[int]:
    """The list read from head to tail, checking every back link on the way."""
    out, s, prev = [], sel.head, NIL
    while s != NIL:
        assert int(sel.prev[s]) == prev
        out.append(s)
        prev, s = s, int(sel.next[s])
    assert prev == sel.tail and len(out) == sel.size
    return out


CHAIN_CASES = {  # name: (slots inserted in this order, slots deleted in this order)
    "oldest chain": (list(range(100)), list(range(40))),
    "middle chain": (list(range(100)), list(range(30, 70))),
    "newest chain": (list(range(100)), list(range(60, 100))),
    "whole list": (list(range(50)), list(range(50))),
    "chain across a wrap": (list(range(50, 100)) + list(range(50)), list(range(80, 100))
                            + list(range(0, 20))),
    "chain with gaps in rows": (list(range(0, 200, 2)), list(range(20, 120, 2))),
    "list order but two chains": (list(range(100)), list(range(10, 30)) + list(range(50, 70))),
    "one chain given out of order": (list(range(100)), list(range(59, 19, -1))),
}


@pytest.mark.parametrize("cls", [Fifo, Lifo])
@pytest.mark.parametrize("case", CHAIN_CASES, ids=list(CHAIN_CASES))
def test_deleting_a_chain_of_the_insertion_order_keeps_the_links(cls, case):
    inserted, deleted = CHAIN_CASES[case]
    sel = cls()
    sel.bind(256)
    sel.insert(np.array(inserted, dtype=np.int64), np.ones(len(inserted)))
    sel.delete(np.array(deleted, dtype=np.int64))
    gone = set(deleted)
    assert _linked(sel) == [s for s in inserted if s not in gone]
    sel.insert(np.array([250, 251], dtype=np.int64), np.ones(2))  # still appends at the end
    assert _linked(sel)[-2:] == [250, 251]


def _writer_table(sampler_name: str):
    from rlreplay import Fifo as FifoSel
    from rlreplay import Prioritized, Table, TrajectoryWriter, Uniform

    sampler = {"prioritized": lambda: Prioritized(0.6), "uniform": Uniform}[sampler_name]()
    table = Table("t", signature={"x": "int64"}, max_size=48, capacity=64, sampler=sampler,
                  remover=FifoSel(), seed=3)
    return table, TrajectoryWriter(table, history=64)


@pytest.mark.parametrize("sampler_name", ["prioritized", "uniform"])
@pytest.mark.parametrize("given", [False, True], ids=["default priority", "priorities given"])
def test_items_on_scattered_anchors_match_the_python_claim(sampler_name, given, monkeypatch):
    """create_items on scattered anchors (the compiled claim of listed slots) leaves keys
    and per-slot state exactly as the Python path does, across ring wraps and evictions."""
    from rlreplay.core import item_index

    if item_index._kernel is None:
        pytest.skip("the compiled slot kernels are not built")
    (fast, fast_w), (slow, slow_w) = _writer_table(sampler_name), _writer_table(sampler_name)
    rng = np.random.default_rng(7)
    for _ in range(12):
        n = int(rng.integers(8, 30))
        rows = {"x": np.arange(n)}
        first = fast_w.append_batch(rows)
        assert slow_w.append_batch(rows) == first
        ids = first + np.flatnonzero(rng.random(n) < 0.7)  # gaps, as episode ends leave
        prios = rng.uniform(0.1, 2.0, len(ids)) if given else None
        got = fast.create_items(ids, prios)
        with monkeypatch.context() as m:
            m.setattr(item_index, "_kernel", None)
            expected = slow.create_items(ids, prios)
        np.testing.assert_array_equal(got, expected)
        for name in ("live", "generation", "times_sampled", "priority"):
            np.testing.assert_array_equal(getattr(fast.index, name), getattr(slow.index, name))
        assert fast.info() == slow.info()
    assert fast.info().overwrite_evictions > 0 and fast.size > 0


def test_claim_slots_rejects_a_slot_outside_the_table_and_writes_nothing():
    from rlreplay.core.table import SLOT_STATE

    kernel = pytest.importorskip("rlreplay.core._slots")
    state = np.zeros(8, dtype=SLOT_STATE)
    state["generation"] = 1
    live, keys = np.zeros(8, bool), np.zeros(3, np.int64)
    for bad in (-1, 8):
        with pytest.raises(ValueError, match="leaves the table"):
            kernel.claim_slots(np.array([0, 3, bad]), keys, state.view(np.uint8), live, None,
                               1.0)
    with pytest.raises(ValueError, match="one entry per new item"):
        kernel.claim_slots(np.array([0, 3]), keys, state.view(np.uint8), live, None, 1.0)
    assert (state["generation"] == 1).all() and not live.any() and not keys.any()
    kernel.claim_slots(np.array([5, 0, 3]), keys, state.view(np.uint8), live, None, 1.0)
    assert live.tolist() == [True, False, False, True, False, True, False, False]
    assert state["generation"].tolist() == [2, 1, 1, 2, 1, 2, 1, 1]


@pytest.mark.parametrize("seed", range(4))
def test_uniform_batch_delete_matches_the_numpy_path(seed, monkeypatch):
    """Uniform.delete through the compiled sparse_delete leaves dense and where exactly as
    its numpy path (so draws with one seed pick the same items either way)."""
    from rlreplay.core.selectors import uniform

    if uniform._kernel is None:
        pytest.skip("the compiled slot kernels are not built")
    rng = np.random.default_rng(seed)
    fast, slow = uniform.Uniform(), uniform.Uniform()
    for sel in (fast, slow):
        sel.bind(300)
    held: list[int] = []
    free = list(range(300))
    for _ in range(40):
        if free and (rng.random() < 0.5 or len(held) < 2):
            new = rng.choice(free, size=int(rng.integers(1, min(60, len(free)) + 1)),
                             replace=False).astype(np.int64)
            for sel in (fast, slow):
                sel.insert(new, np.ones(len(new)))
            held += new.tolist()
            free = [s for s in free if s not in set(new.tolist())]
        else:
            gone = rng.choice(held, size=int(rng.integers(2, len(held) + 1)), replace=False)
            gone = gone.astype(np.int64)
            fast.delete(gone)
            with monkeypatch.context() as m:
                m.setattr(uniform, "_kernel", None)
                slow.delete(gone)
            held = [s for s in held if s not in set(gone.tolist())]
            free += gone.tolist()
        assert fast.size == slow.size == len(held)
        np.testing.assert_array_equal(fast.dense, slow.dense)
        np.testing.assert_array_equal(fast.where[held], slow.where[held])
        assert sorted(fast.dense[: fast.size].tolist()) == sorted(held)


def test_sparse_delete_rejects_a_slot_not_held_and_writes_nothing():
    kernel = pytest.importorskip("rlreplay.core._slots")
    dense = np.array([4, 1, 3, 0, 2, 5], np.int32)
    where = np.empty(6, np.int32)
    where[dense] = np.arange(6, dtype=np.int32)
    before = dense.copy(), where.copy()
    for bad in ([4, 5], [4, -1], [4, 9]):  # 5 sits past size 5: not held
        with pytest.raises(ValueError):
            kernel.sparse_delete(dense, where, 5, np.array(bad, np.int64))
    np.testing.assert_array_equal(dense, before[0])
    np.testing.assert_array_equal(where, before[1])
    assert kernel.sparse_delete(dense, where, 5, np.array([1, 2], np.int64)) == 3
    assert sorted(dense[:3].tolist()) == [0, 3, 4]


def test_appended_batches_are_stored_as_the_numpy_write_stores_them(monkeypatch):
    """A writer's batch goes to the columns in one compiled call when it does not wrap
    (the numpy loop when it does): the columns end up the same either way."""
    from rlreplay import Table, TrajectoryWriter
    from rlreplay.core import storage

    if storage._kernel is None:
        pytest.skip("the compiled store kernel is not built")
    sig = {"obs": ((4,), "float32"), "action": "int64", "done": "bool",
           "frame": ((2, 3), "uint8")}
    rng = np.random.default_rng(5)
    tables, writers = [], []
    for _ in range(2):
        t = Table("t", signature=sig, max_size=40, capacity=40, seed=1)
        tables.append(t)
        writers.append(TrajectoryWriter(t, history=8))
    tables[1].store.compiled_writes = False
    for _ in range(10):  # 10 batches of 3..12 steps wrap the ring of 40 more than once
        n = int(rng.integers(3, 13))
        batch = {"obs": rng.normal(size=(n, 4)), "action": rng.integers(0, 5, n),
                 "done": rng.random(n) < 0.5, "frame": rng.integers(0, 255, (n, 2, 3))}
        first = writers[0].append_batch(batch)
        assert writers[1].append_batch(batch) == first
    for path in sig:
        np.testing.assert_array_equal(tables[0].store.columns[path],
                                      tables[1].store.columns[path])
    assert tables[0].store.next_id == tables[1].store.next_id > 40
