"""One-row inserts into a prioritized table keep both trees exact.

A one-row insert is a batch of one row: it updates the overwritten item's leaf and the
new item's leaf of the sum tree and of the min tree over the same leaves (one compiled
call, or the numpy path with ``RLREPLAY_NO_EXTENSION=1``). These tests insert rows one
at a time and as batches of one row into otherwise equal tables, through the compiled
call and the numpy path, and check the trees against the priorities.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Table, Uniform
from rlreplay.core.selectors import sum_tree

ALPHA = 0.6
SIG = {"obs": ((3,), np.float32), "reward": ((), np.float64)}


@pytest.fixture(params=["compiled", "numpy"])
def path(request, monkeypatch) -> str:
    """Build the trees with the compiled kernel or with the numpy path."""
    if request.param == "compiled":
        if sum_tree._kernel is None:
            pytest.skip("the compiled kernel is not built or RLREPLAY_NO_EXTENSION is set")
    else:
        monkeypatch.setattr(sum_tree, "_kernel", None)
    return request.param


def make(max_size: int, capacity: int | None = None) -> Table:
    return Table(
        "t",
        signature=SIG,
        max_size=max_size,
        capacity=capacity,
        sampler=Prioritized(ALPHA),
        remover=Fifo(),
        seed=1,
    )


def row(i: int) -> dict:
    return {"obs": np.full(3, i, np.float32), "reward": np.float64(i)}


def assert_trees_exact(table: Table) -> None:
    """Every internal node of both trees equals the reduction of its children."""
    sel = table.index.sampler
    for tree in (sel.sums, sel.mins):
        levels = [level.copy() for level in tree.levels]
        tree.rebuild()
        for a, b in zip(levels, tree.levels):
            np.testing.assert_array_equal(a, b)
    positive = sel.sums.leaves[sel.sums.leaves > 0]
    assert sel.mins.root == positive.min()


@pytest.mark.parametrize("max_size, capacity", [(40, None), (300, None), (40, 64)])
def test_one_row_inserts_match_batches_of_one_row(path, max_size, capacity):
    rng = np.random.default_rng(max_size)
    one, batch = make(max_size, capacity), make(max_size, capacity)
    for i in range(3 * max_size + 5):  # fill, then overwrite the oldest items
        prio = None if i % 3 == 0 else float(rng.uniform(0.01, 4.0))
        one.insert(row(i), priorities=prio)
        rows = {k: np.asarray(v)[None] for k, v in row(i).items()}
        batch.insert(rows, priorities=None if prio is None else [prio])
    a, b = one.index.sampler, batch.index.sampler
    np.testing.assert_allclose(a.sums.leaves, b.sums.leaves, rtol=1e-15, atol=0)
    np.testing.assert_allclose(a.sums.root, b.sums.root, rtol=1e-12)
    np.testing.assert_array_equal(a.held, b.held)
    assert len(one) == len(batch) == max_size
    np.testing.assert_allclose(
        a.sums.leaves[a.held], one.index.priority[a.held] ** ALPHA, rtol=1e-15
    )
    assert_trees_exact(one)
    assert one.info().evictions == batch.info().evictions


def test_new_items_get_the_largest_priority_seen(path):
    table = make(16)
    for i in range(16):
        table.insert(row(i), priorities=1.0)
    table.insert(row(16), priorities=9.0)
    table.insert(row(17))  # no priority: the largest seen so far
    sums = table.index.sampler.sums
    slot = 17 % 16
    assert sums.leaves[slot] == 9.0**ALPHA
    assert table.index.priority[slot] == 9.0
    assert_trees_exact(table)
    assert table.index.sampler.min_probability() == pytest.approx(1.0 / sums.root)


def test_zero_priority_rows_are_never_drawn_and_leave_the_min_tree(path):
    table = make(32)
    for i in range(40):
        table.insert(row(i), priorities=0.0 if i % 2 else 2.0)
    sel = table.index.sampler
    assert sel.mins.root == 2.0**ALPHA
    sample = table.sample(32)
    assert (sample.data["reward"] % 2 == 0).all()
    assert_trees_exact(table)


REMOVERS = {
    "fifo": Fifo,
    "lifo": Lifo,
    "min-heap": MinHeap,
    "max-heap": MaxHeap,
    "uniform": Uniform,
    "prioritized": lambda: Prioritized(ALPHA),
}


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
@pytest.mark.parametrize("remover", REMOVERS.values(), ids=REMOVERS.keys())
def test_one_row_eviction_below_capacity_matches_batches_of_one_row(path, sampler, remover):
    """A table of max_size below its store's capacity evicts the remover's choice for
    each new row: one row at a time the same victim as a batch of one row."""
    rng = np.random.default_rng(7)
    tables = [
        Table(
            "t",
            signature=SIG,
            max_size=24,
            capacity=64,
            sampler=Uniform() if sampler == "uniform" else Prioritized(ALPHA),
            remover=remover(),
            seed=2,
        )
        for _ in range(2)
    ]
    one, batch = tables
    all_keys: list[list[int]] = [[], []]
    for i in range(150):
        prio = float(rng.uniform(0.01, 4.0))
        all_keys[0].append(int(one.insert(row(i), priorities=prio)[0]))
        rows = {k: np.asarray(v)[None] for k, v in row(i).items()}
        all_keys[1].append(int(batch.insert(rows, priorities=[prio])[0]))
        assert len(one) == len(batch) == min(i + 1, 24)
    assert all_keys[0] == all_keys[1]
    np.testing.assert_array_equal(one.index.live, batch.index.live)
    np.testing.assert_array_equal(one.index.priority, batch.index.priority)
    a, b = one.info(), batch.info()
    assert (a.evictions, a.overwrite_evictions) == (b.evictions, b.overwrite_evictions)
    assert a.evictions > 0 and a.evictions + a.overwrite_evictions == 150 - 24
    if sampler == "prioritized":
        assert_trees_exact(one)
        a, b = one.index.sampler.sums.leaves, batch.index.sampler.sums.leaves
        np.testing.assert_allclose(a, b, rtol=1e-15, atol=0)  # x**alpha: Python or numpy pow
