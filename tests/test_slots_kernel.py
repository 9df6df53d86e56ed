"""The compiled per-slot loops (held_slots, claim_range) against the Python paths of
update, delete and insert.

Two identical prioritized tables get the same calls, one through the kernel and one with
it switched off: keys, priorities, sizes, counters and the sum trees must agree.
Skipped when the extension is not built or is turned off with ``RLREPLAY_NO_EXTENSION=1``.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import Prioritized, Table
from rlreplay.core import item_index
from rlreplay.core.keys import make_keys
from rlreplay.core.table import SLOT_STATE
from rlreplay.errors import InvalidArgumentError

kernel = pytest.importorskip("rlreplay.core._slots")
if item_index._kernel is None:
    pytest.skip("RLREPLAY_NO_EXTENSION is set", allow_module_level=True)

CAPACITY = 64


def table_pair() -> tuple[Table, Table]:
    """Two tables whose ring has wrapped once (so stale keys exist for half the slots)."""
    tables = []
    for _ in range(2):
        t = Table(
            "t", signature={"x": "int64"}, max_size=CAPACITY, sampler=Prioritized(0.7), seed=2
        )  # one seed and name: one key origin, so each table's keys are the other's
        t.insert({"x": np.arange(CAPACITY)})
        t.insert({"x": np.arange(CAPACITY // 2)})
        tables.append(t)
    return tables[0], tables[1]


def all_keys(table: Table) -> np.ndarray:
    """Current keys of every slot, plus the previous generation's (stale) keys."""
    slots = np.arange(CAPACITY, dtype=np.int64)
    gens = table.index.generation.astype(np.int64)
    current = make_keys(slots, gens, table.index.origin)
    older = make_keys(slots[gens > 1], gens[gens > 1] - 1, table.index.origin)
    return np.concatenate([current, older])


def assert_same_state(a: Table, b: Table) -> None:
    np.testing.assert_array_equal(a.index.priority, b.index.priority)
    np.testing.assert_array_equal(a.index.live, b.index.live)
    np.testing.assert_array_equal(a.sampler.sums.leaves, b.sampler.sums.leaves)
    assert a.sampler.sums.root == pytest.approx(b.sampler.sums.root, rel=1e-12)
    assert a.sampler.mins.root == b.sampler.mins.root
    assert a.info() == b.info()


def both(fast: Table, slow: Table, method: str, args: tuple, monkeypatch) -> tuple:
    """``method(*args)`` on ``fast`` through the kernel and on ``slow`` without it."""
    got = getattr(fast, method)(*args)
    with monkeypatch.context() as m:
        m.setattr(item_index, "_kernel", None)
        expected = getattr(slow, method)(*args)
    return got, expected


@pytest.mark.parametrize("seed", range(5))
def test_updates_and_deletes_match_the_python_path(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    fast, slow = table_pair()
    for _ in range(20):
        keys = rng.choice(all_keys(fast), size=int(rng.integers(1, 40)))  # repeats, stale
        if rng.random() < 0.7:
            prios = rng.uniform(0.0, 3.0, len(keys))
            got, expected = both(fast, slow, "update_priorities", (keys, prios), monkeypatch)
        else:
            got, expected = both(fast, slow, "delete", (keys,), monkeypatch)
        assert got == expected
        assert_same_state(fast, slow)
        if rng.random() < 0.3:
            rows = {"x": np.arange(int(rng.integers(1, 9)))}
            prios = None if rng.random() < 0.5 else rng.uniform(0.0, 2.0, len(rows["x"]))
            got, expected = both(fast, slow, "insert", (rows, prios), monkeypatch)
            np.testing.assert_array_equal(got, expected)
            assert_same_state(fast, slow)


def test_last_priority_for_a_key_wins_and_stale_repeats_count_each_time():
    table, _ = table_pair()
    live = all_keys(table)[:3]
    stale = all_keys(table)[-1]
    keys = np.array([live[0], stale, live[1], live[0], stale, live[2]], dtype=np.int64)
    assert table.update_priorities(keys, np.array([1.0, 9.0, 2.0, 5.0, 9.0, 3.0])) == 3
    np.testing.assert_array_equal(table.index.priority[keys[[0, 2, 5]] & 0xFFFFFFFF], [5, 2, 3])
    assert table.info().stale_updates == 2


BAD = {
    "never-issued": lambda keys: (keys + (5 << 32), np.ones(len(keys))),
    "negative-key": lambda keys: (np.r_[keys[:-1], -1], np.ones(len(keys))),
    "slot-outside": lambda keys: (np.r_[keys[:-1], (1 << 32) | CAPACITY], np.ones(len(keys))),
    "nan-priority": lambda keys: (keys, np.r_[np.ones(len(keys) - 1), np.nan]),
    "negative-priority": lambda keys: (keys, np.r_[np.ones(len(keys) - 1), -1.0]),
    "inf-priority": lambda keys: (keys, np.r_[np.ones(len(keys) - 1), np.inf]),
}


@pytest.mark.parametrize("make", BAD.values(), ids=BAD.keys())
def test_a_bad_entry_raises_and_changes_nothing(make):
    table, untouched = table_pair()
    keys, prios = make(all_keys(table)[:6])
    with pytest.raises(InvalidArgumentError):
        table.update_priorities(keys, prios)
    assert_same_state(table, untouched)


def test_claim_range_rejects_a_range_outside_the_table_and_writes_nothing():
    state = np.zeros(8, dtype=SLOT_STATE)
    state["generation"] = 1
    live, keys = np.zeros(8, bool), np.zeros(3, np.int64)
    for start in (-1, 6):
        with pytest.raises(ValueError, match="leave the table"):
            kernel.claim_range(start, keys, state.view(np.uint8), live, None, 1.0)
    assert (state["generation"] == 1).all() and not live.any() and not keys.any()


def test_kernel_rejects_wrong_buffers():
    state, live = np.ones(8, dtype=SLOT_STATE).view(np.uint8), np.ones(8, bool)
    out = np.zeros(2, np.int64)
    with pytest.raises(TypeError):
        kernel.held_slots(np.array([1, 2], np.int32), state, live, None, out, None)
    with pytest.raises(TypeError):
        kernel.held_slots(np.array([1, 2]), state, live, np.ones(2), out, None)
    with pytest.raises(TypeError):  # the records, not their bytes
        kernel.held_slots(np.array([1, 2]), np.ones(8, dtype=SLOT_STATE), live, None, out, None)
    with pytest.raises(ValueError):
        kernel.held_slots(np.array([1, 2]), state, live[:4], None, out, None)


@pytest.mark.parametrize("origin", [-1, 2**31 - 1, 2**40])
def test_kernels_reject_an_origin_outside_the_generations(origin):
    state, live = np.zeros(8, dtype=SLOT_STATE), np.zeros(8, bool)
    keys, out = np.zeros(2, np.int64), np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="origin"):
        kernel.held_slots(np.array([1, 2]), state.view(np.uint8), live, None, out, None, origin)
    with pytest.raises(ValueError, match="origin"):
        kernel.claim_range(0, keys, state.view(np.uint8), live, None, 1.0, origin)
    assert not live.any() and not state["generation"].any() and not keys.any()
