"""Priorities a prioritized table could not sum are refused before anything changes.

``Prioritized`` draws in proportion to ``priority ** priority_exponent`` summed in a
float64 tree; a finite priority whose weight (or the sum of such weights) overflows would
make every probability 0 or NaN and sampling silently wrong. Such priorities are refused
on every path that takes one, naming the value and the largest the table takes.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import Fifo, InvalidArgumentError, MinHeap, Prioritized, Table, Uniform


def table(sampler, max_size: int = 10) -> Table:
    return Table("t", signature={"a": "int64"}, max_size=max_size, sampler=sampler, seed=0)


def test_the_largest_priority_taken_keeps_the_sum_of_every_slot_finite():
    t = table(Prioritized(2.0), max_size=1000)
    cap = t.index.sampler.max_priority
    keys = t.insert({"a": np.arange(1000)}, priorities=np.full(1000, cap))
    assert np.isfinite(t.index.sampler.sums.root)
    t.update_priorities(keys[:1], [1.0])
    sample = t.sample(64)
    probabilities = sample.info.probabilities
    assert np.isfinite(probabilities).all() and (probabilities > 0).all()


CALLS = {
    "insert": lambda t, keys, p: t.insert({"a": np.arange(2)}, priorities=[1.0, p]),
    "update_priorities": lambda t, keys, p: t.update_priorities(keys, [1.0, p]),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("exponent", [1.0, 2.0, 4.0])
def test_a_priority_beyond_the_cap_is_refused_and_nothing_changes(call, exponent):
    t = table(Prioritized(exponent))
    keys = t.insert({"a": np.arange(2)}, priorities=[1.0, 2.0])
    before = (t.index.sampler.sums.levels[0].copy(), t.info().to_dict(), len(t))
    too_large = min(t.index.sampler.max_priority * 1.5, 1e308)
    with pytest.raises(InvalidArgumentError, match="beyond the largest this table takes"):
        call(t, keys, too_large)
    np.testing.assert_array_equal(t.index.sampler.sums.levels[0], before[0])
    assert t.info().to_dict() == before[1] and len(t) == before[2]


def test_create_items_and_default_priority_are_checked_too():
    sig = {"a": "int64"}
    t = Table("w", signature=sig, max_size=10, sampler=Prioritized(3.0))
    with pytest.raises(InvalidArgumentError, match="default_priority"):
        Table("d", signature=sig, max_size=10, sampler=Prioritized(3.0), default_priority=1e300)
    with pytest.raises(InvalidArgumentError, match="beyond the largest"):
        t.check_items(1, [1e300])


@pytest.mark.parametrize(
    "sampler", [Uniform(), Fifo(), MinHeap(), Prioritized(0.0), Prioritized(0.5)]
)
def test_selectors_whose_weights_cannot_overflow_take_any_finite_priority(sampler):
    t = table(sampler)
    t.insert({"a": np.arange(2)}, priorities=[1e308, 0.5])
    assert len(t) == 2


@pytest.mark.parametrize("seed", [-1, 1.5, "abc", True])
def test_a_seed_that_is_not_an_int_of_zero_or_more_is_refused_by_name(seed):
    with pytest.raises(InvalidArgumentError, match="seed="):
        table(Uniform()).__class__("t", signature={"a": "int64"}, max_size=4, seed=seed)


@pytest.mark.parametrize("priorities", ["1", ["1", "2"], True, [True, False], None])
def test_priorities_must_be_numbers_not_strings_or_bools(priorities):
    t = table(Prioritized(1.0))
    if priorities is None:
        t.insert({"a": np.arange(2)}, priorities=priorities)
        return
    with pytest.raises(InvalidArgumentError, match="priorities must be a number"):
        t.insert({"a": np.arange(2)}, priorities=priorities)
    assert len(t) == 0
