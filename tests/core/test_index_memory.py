"""The item index's memory: slot records without priorities where no selector uses them.

A table whose sampler and remover ignore priorities (Uniform, Fifo, Lifo) keeps 8-byte
slot records (generation, times sampled); priorities given to it are checked and dropped,
and read as ``UNKEPT_PRIORITY``. The compiled loops over 8-byte records must agree with
their numpy twins, and the index's state must restore exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Table, Uniform
from rlreplay.core import item_draws, item_index
from rlreplay.core.item_index import SLOT_STATE, SLOT_STATE_UNPRIORITIZED, UNKEPT_PRIORITY
from rlreplay.errors import InvalidArgumentError

SIG = {"x": "int64"}

RECORDS = {  # (sampler, remover) -> record bytes
    "uniform+fifo": (Uniform, Fifo, 8),
    "lifo+fifo": (Lifo, Fifo, 8),
    "fifo+lifo": (Fifo, Lifo, 8),
    "prioritized+fifo": (lambda: Prioritized(0.6), Fifo, 16),
    "uniform+minheap": (Uniform, MinHeap, 16),
    "maxheap+fifo": (MaxHeap, Fifo, 16),
}


@pytest.mark.parametrize("case", sorted(RECORDS))
def test_slot_records_hold_a_priority_only_where_a_selector_uses_it(case):
    sampler, remover, size = RECORDS[case]
    table = Table("t", signature=SIG, max_size=16, sampler=sampler(), remover=remover())
    index = table.index
    assert index.slot_state.dtype.itemsize == size
    assert index.slot_bytes.shape == (16, size)
    assert index.keeps_priorities == (size == 16)
    keys = table.insert({"x": np.arange(4)}, priorities=[1.0, 2.0, 3.0, 4.0])
    expected = [1.0, 2.0, 3.0, 4.0] if size == 16 else [UNKEPT_PRIORITY] * 4
    assert index.priority[keys & 0xFFFFFFFF].tolist() == expected


def test_a_uniform_table_checks_priorities_then_drops_them():
    table = Table("t", signature=SIG, max_size=8, seed=1)
    keys = table.insert({"x": np.arange(8)}, priorities=np.arange(8.0))
    before = table.index.slot_state.copy(), table.index.live.copy()
    for bad in ([-1.0] * 8, [np.nan] * 8, [np.inf] * 8):
        with pytest.raises(InvalidArgumentError):
            table.update_priorities(keys, bad)
        with pytest.raises(InvalidArgumentError):
            table.insert({"x": np.arange(2)}, priorities=bad[:2])
    assert table.index.slot_state.tobytes() == before[0].tobytes()
    assert (table.index.live == before[1]).all()
    assert table.update_priorities(keys[:3], [5.0, 6.0, 7.0]) == 3
    batch = table.sample(8)
    assert (batch.info.priorities == UNKEPT_PRIORITY).all()
    with pytest.raises(ValueError):  # the constant column is read-only
        table.index.priority[0] = 2.0


def operate(table: Table, rng: np.random.Generator) -> list:
    """A fixed mix of batch and one-row inserts, updates, deletes (stale keys included) and
    samples; returns what the calls returned."""
    out = []
    keys = table.insert({"x": np.arange(24)})
    for i in range(30):
        op = i % 5
        if op == 0:
            keys = np.r_[keys, table.insert({"x": np.arange(int(rng.integers(1, 9)))})]
        elif op == 1:
            keys = np.r_[keys, table.insert({"x": np.int64(i)})]
        elif op == 2:
            pick = rng.choice(keys, size=6)
            out.append(table.update_priorities(pick, rng.uniform(0.1, 2.0, 6)))
        elif op == 3:
            out.append(table.delete(rng.choice(keys, size=2)))
        else:
            s = table.sample(5)
            out.append((s.info.keys.tolist(), s.info.priorities.tolist(), s.info.times_sampled))
    return out


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_compiled_loops_over_records_match_the_numpy_path(sampler, monkeypatch):
    if item_index._kernel is None or item_draws._kernel is None:
        pytest.skip("the compiled kernels are not built or are switched off")

    def make():
        chosen = Uniform() if sampler == "uniform" else Prioritized(0.6)
        return Table("t", signature=SIG, max_size=32, sampler=chosen, seed=4)

    fast, slow = make(), make()
    got = operate(fast, np.random.default_rng(0))
    with monkeypatch.context() as m:
        m.setattr(item_index, "_kernel", None)
        m.setattr(item_draws, "_kernel", None)
        expected = operate(slow, np.random.default_rng(0))
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        if isinstance(a, tuple):
            assert a[:2] == b[:2]
            np.testing.assert_array_equal(a[2], b[2])
        else:
            assert a == b
    assert fast.index.slot_state.tobytes() == slow.index.slot_state.tobytes()
    np.testing.assert_array_equal(fast.index.live, slow.index.live)


def test_kernels_take_8_or_16_byte_records_and_refuse_other_strides():
    kernel = pytest.importorskip("rlreplay.core._slots")
    draws = pytest.importorskip("rlreplay.core._draws")
    short = np.zeros(8, SLOT_STATE_UNPRIORITIZED)
    live, keys = np.zeros(8, bool), np.empty(3, np.int64)
    kernel.claim_range(2, keys, short.view(np.uint8).reshape(8, 8), live, None, 7.0)
    assert short["generation"].tolist() == [0, 0, 1, 1, 1, 0, 0, 0]
    full = np.zeros(8, SLOT_STATE)
    kernel.claim_range(2, keys, full.view(np.uint8).reshape(8, 16), live, None, 7.0)
    assert full["priority"].tolist() == [0, 0, 7, 7, 7, 0, 0, 0]
    out = (np.empty(2, np.int64), np.full(2, -1.0), np.empty(2, np.uint32))
    draws.mark_sampled(np.array([2, 2]), short.view(np.uint8).reshape(8, 8), *out)
    assert out[1].tolist() == [-1.0, -1.0] and out[2].tolist() == [1, 2]  # no priority read
    odd = np.zeros((8, 12), np.uint8)
    with pytest.raises(TypeError, match="slot records"):
        kernel.claim_range(0, keys, odd, live, None, 1.0)
    with pytest.raises(TypeError, match="slot records"):
        draws.mark_sampled(np.array([1]), odd, *(a[:1] for a in out))


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_index_state_restores_exactly(sampler):
    def make():
        chosen = Uniform() if sampler == "uniform" else Prioritized(0.6)
        return Table("t", signature=SIG, max_size=32, sampler=chosen, seed=4)

    a, b = make(), make()
    operate(a, np.random.default_rng(1))
    state = a.index.state(a.index.state_buffers())
    b.index.load_state(state)
    assert a.index.slot_state.tobytes() == b.index.slot_state.tobytes()
    np.testing.assert_array_equal(a.index.live, b.index.live)
    np.testing.assert_array_equal(a.index.priority, b.index.priority)
    np.testing.assert_array_equal(state["priority"], a.index.priority)
    b.rng.bit_generator.state = a.rng.bit_generator.state  # the table's, not the index's
    assert a.sample(8).info.keys.tolist() == b.sample(8).info.keys.tolist()


# ---------------------------------------------------------------- idle removers
BYTES_PER_ITEM = {  # sampler -> (most index bytes per item with an idle Fifo remover)
    "uniform": (Uniform, 24),
    "prioritized": (lambda: Prioritized(0.6), 28),
}


@pytest.mark.parametrize("sampler", sorted(BYTES_PER_ITEM))
def test_a_table_that_never_evicts_by_choice_binds_no_remover(sampler):
    make, most = BYTES_PER_ITEM[sampler]
    table = Table("t", signature=SIG, max_size=1 << 14, sampler=make())
    assert not table.index.remover_active
    assert not hasattr(table.remover, "prev")  # the Fifo's links were never made
    assert table.index_nbytes() / table.max_size <= most
    for _ in range(3):  # the ring goes round three times
        table.insert({"x": np.arange(1 << 14)})
    assert len(table) == 1 << 14 and table.info().overwrite_evictions == 2 << 14
    assert table.info().evictions == 0  # the remover was never asked


def test_a_table_that_may_evict_keeps_its_remover_and_evicts_the_oldest():
    table = Table("t", signature=SIG, capacity=16, max_size=8, seed=0)
    assert table.index.remover_active and table.remover.size == 0
    table.insert({"x": np.arange(6)})
    table.insert({"x": np.arange(6, 10)})
    assert table.remover.size == 8 and table.info().evictions == 2
    steps = set(table.sample(8).data["x"].tolist())
    assert steps <= set(range(2, 10))


def test_an_idle_removers_saved_state_holds_the_items_oldest_first():
    idle = Table("t", signature=SIG, max_size=16, seed=0)
    keys = idle.insert({"x": np.arange(16)})
    keys = np.r_[keys, idle.insert({"x": np.arange(4)})]  # slots 0..3 again: 3 is newest
    idle.delete(keys[[6, 9]])  # slots 6 and 9
    state = idle.index.state(idle.index.state_buffers())
    # An index of the same slots whose remover is active takes the saved order.
    active = Table("t", signature=SIG, capacity=16, max_size=15, seed=0)
    assert active.index.remover_active
    active.index.load_state(state)
    expected = [4, 5, 7, 8, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3]
    assert active.remover.first(14).tolist() == expected
    assert active.remover.size == len(idle) == 14
    # And back: an idle index ignores the saved remover's state.
    again = Table("t", signature=SIG, max_size=16, seed=0)
    again.index.load_state(active.index.state())
    np.testing.assert_array_equal(again.index.live, idle.index.live)
    assert again.index.state()["remover"]["prev"].tolist() == state["remover"]["prev"].tolist()
