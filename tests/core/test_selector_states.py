"""A saved index state whose sampler or remover part does not fit is refused before
anything loads: the index is left exactly as it was (validate, then mutate)."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import Fifo, MinHeap, Prioritized, Table, Uniform
from rlreplay.core import keys
from rlreplay.errors import InvalidArgumentError

SIG = {"obs": ((2,), np.float32)}


def _table(sampler, remover, max_size):
    # A capacity above max_size keeps the remover active (it holds a state of its own).
    t = Table("t", signature=SIG, sampler=sampler, remover=remover, max_size=max_size, capacity=16)
    for p in range(1, 6):
        t.insert({"obs": np.ones((1, 2), np.float32)}, priorities=[float(p)])
    return t


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def _shorter(state: dict, part: str) -> dict:
    bad = dict(state)
    bad[part] = state[part][:-1].copy()
    return bad


CASES = {
    # name: (sampler, remover, max_size, which selector state, how it is damaged)
    "prioritized sums of another size": (Prioritized(0.6), Fifo(), 8, "sampler", "sums"),
    "prioritized held of another size": (Prioritized(0.6), Fifo(), 8, "sampler", "held"),
    "uniform slot beyond the capacity": (Uniform(), Fifo(), 8, "sampler", "dense-out"),
    "uniform slot held twice": (Uniform(), Fifo(), 8, "sampler", "dense-twice"),
    "fifo links of another size": (Uniform(), Fifo(), 4, "remover", "prev"),
    "heap keys of another size": (Uniform(), MinHeap(), 4, "remover", "key"),
    "sampler state not a dict": (Prioritized(0.6), Fifo(), 8, "sampler", "not-a-dict"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_selector_state_that_does_not_fit_is_refused_and_nothing_changes(case):
    sampler, remover, max_size, which, damage = CASES[case]
    t = _table(sampler, remover, max_size)
    saved = t.index.state()
    for p in (7.0, 9.0):
        t.insert({"obs": np.zeros((1, 2), np.float32)}, priorities=[p])
    before = t.index.state()
    bad = dict(saved)
    part = dict(saved[which])
    if damage == "dense-out":
        part["dense"] = part["dense"].copy()
        part["dense"][0] = 10**6
    elif damage == "dense-twice":
        part["dense"] = part["dense"].copy()
        part["dense"][1] = part["dense"][0]
    elif damage == "not-a-dict":
        part = [1, 2, 3]
    else:
        part = _shorter(part, damage)
    bad[which] = part
    with t.store.mutex, pytest.raises(InvalidArgumentError, match="state"):
        t.index.load_state(bad)
    assert _same(t.index.state(), before)
    # The undamaged state still loads.
    with t.store.mutex:
        t.index.load_state(saved)
    assert _same(t.index.state(), saved)


@pytest.mark.parametrize("n", [2, 1000, keys._MARK_ABOVE + 1000], ids=["two", "batch", "index"])
def test_duplicate_slots_are_found_by_sorting_and_by_marking_alike(n):
    capacity = 2 * n
    slots = np.random.default_rng(n).permutation(capacity)[:n]
    assert not keys.has_duplicates(slots, capacity)
    assert not keys.has_duplicates(slots)
    slots[-1] = slots[0]
    assert keys.has_duplicates(slots, capacity)
    assert keys.has_duplicates(slots)
