"""MinHeap / MaxHeap choose k victims as k removals of the winner one at a time would.

``first(k)`` descends the tournament tree keeping the k best nodes per level instead of
sorting every held item; these tests compare it with popping the winner k times and with a
plain sort by (priority, age), over named cases and random histories with many ties.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay import MaxHeap, MinHeap, Table
from rlreplay.core.selectors.heap import _Heap


def popped_one_at_a_time(heap: _Heap, k: int) -> list[int]:
    """The slots that k removals of the current winner take, in order (on a copy)."""
    heap = copy.deepcopy(heap)
    out = []
    for _ in range(min(k, heap.size)):
        winner = int(heap.first(1)[0])
        out.append(winner)
        heap.delete(np.array([winner]))
    return out


def by_priority_then_age(heap: _Heap, k: int) -> list[int]:
    """The reference order: held slots sorted by (key, seq)."""
    held = np.flatnonzero(heap.seq != np.iinfo(np.int64).max)
    order = np.lexsort((heap.seq[held], heap.key[held]))
    return held[order[:k]].tolist()


def heap_of(cls: type, capacity: int, priorities: dict[int, float]) -> _Heap:
    heap = cls()
    heap.bind(capacity)
    for slot, priority in priorities.items():  # one at a time: insertion order is age
        heap.insert(np.array([slot]), np.array([priority]))
    return heap


# name: (class, capacity, {slot: priority} in insertion order, updates, deletes, k)
CASES = {
    "min-distinct": (MinHeap, 40, {3: 5.0, 17: 1.0, 30: 4.0, 0: 2.0, 39: 3.0}, {}, [], 3),
    "max-distinct": (MaxHeap, 40, {3: 5.0, 17: 1.0, 30: 4.0, 0: 2.0, 39: 3.0}, {}, [], 3),
    "min-all-tied-oldest-first": (MinHeap, 300, {s: 1.0 for s in range(299, 0, -7)}, {}, [], 9),
    "max-all-tied-oldest-first": (MaxHeap, 300, {s: 1.0 for s in range(0, 299, 5)}, {}, [], 9),
    "update-makes-a-tie-newest": (MinHeap, 20, {1: 1.0, 2: 1.0, 3: 2.0}, {1: 1.0}, [], 3),
    "update-to-new-lowest": (MinHeap, 20, {1: 3.0, 2: 4.0, 3: 5.0}, {3: 0.5}, [], 2),
    "deleted-slots-skipped": (MinHeap, 64, {s: float(s % 4) for s in range(64)}, {}, [0, 4], 5),
    "k-above-size": (MaxHeap, 64, {5: 1.0, 50: 2.0}, {}, [], 10),
    "k-is-size": (MinHeap, 600, {s: float(s % 3) for s in range(0, 600, 3)}, {}, [], 200),
    "winners-in-one-subtree": (
        MinHeap,
        4096,
        {s: 0.0 if s < 16 else 1.0 for s in range(64)},
        {},
        [],
        20,
    ),
    "zero-priorities-max": (MaxHeap, 32, {s: 0.0 for s in range(10)}, {4: 0.0}, [], 4),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_k_victims_are_the_slots_k_single_removals_take(case):
    cls, capacity, priorities, updates, deletes, k = case
    heap = heap_of(cls, capacity, priorities)
    for slot, priority in updates.items():
        heap.update(np.array([slot]), np.array([priority]))
    if deletes:
        heap.delete(np.array(deletes))
    expected = popped_one_at_a_time(heap, k)
    assert heap.first(k).tolist() == expected == by_priority_then_age(heap, k)
    assert heap.choose_victims(k, np.random.default_rng(0)).tolist() == expected


OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "update", "delete"]),
        st.lists(st.integers(0, 1199), min_size=1, max_size=40, unique=True),
        st.sampled_from([0.0, 1.0, 2.0, 0.5, 3.25]),  # few values: many ties
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from([MinHeap, MaxHeap]),
    st.sampled_from([17, 256, 257, 1200]),  # one to three levels, partial last groups
    OPS,
    st.integers(1, 300),
    st.randoms(use_true_random=False),
)
def test_first_k_matches_single_removals_after_any_history(cls, capacity, ops, k, rnd):
    heap = cls()
    heap.bind(capacity)
    held: set[int] = set()
    for op, slots, priority in ops:
        slots = [s % capacity for s in slots]
        slots = list(dict.fromkeys(slots))
        prios = np.array([priority + rnd.choice([0.0, 0.0, 1.0]) for _ in slots])
        if op == "insert":
            new = [s for s in slots if s not in held]
            if new:
                heap.insert(np.array(new), prios[: len(new)])
                held.update(new)
        else:
            old = [s for s in slots if s in held]
            if old and op == "update":
                heap.update(np.array(old), prios[: len(old)])
            elif old:
                heap.delete(np.array(old))
                held.difference_update(old)
    assert heap.size == len(held)
    expected = by_priority_then_age(heap, k)
    assert heap.first(k).tolist() == expected
    if k <= 40:
        assert popped_one_at_a_time(heap, k) == expected


@pytest.mark.parametrize("cls", [MinHeap, MaxHeap])
def test_a_full_table_evicts_the_k_items_a_heap_remover_puts_first(cls):
    table = Table("t", signature={"x": "int64"}, max_size=500, capacity=2000, remover=cls())
    rng = np.random.default_rng(1)
    priorities = rng.integers(0, 20, 500).astype(float)  # ties
    table.insert({"x": np.arange(500)}, priorities=priorities)  # slots 0 .. 499
    expected = sorted(by_priority_then_age(table.remover, 64))
    table.insert({"x": np.arange(64)}, priorities=1.0)  # slots 500 .. 563
    assert table.info().evictions == 64 and len(table) == 500
    assert np.flatnonzero(~table.index.live[:500]).tolist() == expected


class _Counted(np.ndarray):
    """An index array that counts the elements numpy's elementwise operations read."""

    touched = 0

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        for x in inputs:
            if isinstance(x, _Counted):
                _Counted.touched += x.size
        plain = tuple(x.view(np.ndarray) if isinstance(x, _Counted) else x for x in inputs)
        return getattr(ufunc, method)(*plain, **kwargs)


@pytest.mark.parametrize("cls", [MinHeap, MaxHeap])
def test_choosing_k_victims_reads_entries_in_proportion_to_k_not_to_the_items_held(cls):
    capacity, k = 1 << 16, 8
    heap = cls()
    heap.bind(capacity)
    heap.insert(np.arange(capacity), np.random.default_rng(2).integers(0, 50, capacity) * 1.0)
    expected = by_priority_then_age(heap, k)
    heap.key, heap.seq = heap.key.view(_Counted), heap.seq.view(_Counted)
    _Counted.touched = 0
    assert heap.choose_victims(k, np.random.default_rng(0)).tolist() == expected
    assert _Counted.touched < capacity // 16  # a sort of every item reads them all
