"""The compiled sum-tree kernel against the numpy path of KaryTree.

Skipped when the extension is not built (an install without a C compiler) or is turned
off with ``RLREPLAY_NO_EXTENSION=1``.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay.core.selectors import sum_tree
from rlreplay.core.selectors.sum_tree import FANOUT, KaryTree

kernel = pytest.importorskip("rlreplay.core.selectors._sumtree")
if sum_tree._kernel is None:
    pytest.skip("RLREPLAY_NO_EXTENSION is set", allow_module_level=True)

SIZES = {"one": 1, "fanout": 16, "fanout+1": 17, "two-levels": 257, "flat": 5000, "deep": 70_000}


def pair(size: int, op: str) -> tuple[KaryTree, KaryTree]:
    return KaryTree(size, op, use_kernel=True), KaryTree(size, op, use_kernel=False)


def assert_parents_exact(tree: KaryTree) -> None:
    """Every internal node equals the reduction of its 16 children (no drift)."""
    reduce = np.sum if tree.op == "sum" else np.min
    for lower, upper in zip(tree.levels, tree.levels[1:]):
        m = len(lower) // FANOUT
        np.testing.assert_allclose(
            upper[:m], reduce(lower.reshape(-1, FANOUT), axis=1), rtol=1e-15, atol=0
        )


def test_kernel_is_used_by_default_unless_disabled():
    tree = KaryTree(10, "sum")
    assert (tree._kernel is not None) == (sum_tree._kernel is not None)
    assert KaryTree(10, "sum", use_kernel=False)._kernel is None


@pytest.mark.parametrize("op", ["sum", "min"])
@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_set_matches_numpy_path(size, op):
    rng = np.random.default_rng(size)
    fast, slow = pair(size, op)
    for _ in range(20):
        k = int(rng.integers(1, max(2, size // 3) + 1))
        idx = rng.integers(0, size, k)  # duplicates: the last value wins
        values = rng.uniform(0.0, 3.0, k)
        values[rng.random(k) < 0.2] = 0.0 if op == "sum" else np.inf
        fast.set(idx, values)
        slow.set(idx, values)
        np.testing.assert_array_equal(fast.levels[0], slow.levels[0])
        for a, b in zip(fast.levels, slow.levels):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
        assert_parents_exact(fast)


def test_duplicate_indices_last_wins():
    fast, _ = pair(300, "sum")
    fast.set(np.array([5, 200, 5, 5]), np.array([1.0, 2.0, 3.0, 4.0]))
    assert fast.leaves[5] == 4.0 and fast.root == 6.0
    mins, _ = pair(300, "min")
    mins.set(np.array([7, 7]), np.array([0.5, 9.0]))
    assert mins.leaves[7] == 9.0 and mins.root == 9.0


def test_many_updates_do_not_drift():
    fast, _ = pair(4096, "sum")
    rng = np.random.default_rng(1)
    for _ in range(300):
        idx = rng.integers(0, 4096, 64)
        fast.set(idx, rng.uniform(0, 1e6, 64) if rng.random() < 0.5 else rng.uniform(0, 1e-6, 64))
    fast.set(np.arange(4096), np.ones(4096))
    assert fast.root == 4096.0


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_find_prefix_matches_numpy_path(size):
    rng = np.random.default_rng(size + 1)
    fast, slow = pair(size, "sum")
    w = rng.uniform(0.0, 2.0, size)
    w[rng.random(size) < 0.3] = 0.0  # zero-weight leaves are never returned
    w[0] = max(w[0], 0.5)
    for t in (fast, slow):
        t.set(np.arange(size), w)
    targets = rng.random(2000) * fast.root
    a, b = fast.find_prefix(targets), slow.find_prefix(targets)
    assert a.dtype == np.int64
    assert (w[a] > 0).all()
    # Both paths pick the leaf whose cumulative range holds the target; they may differ
    # only where rounding puts a target on a boundary.
    cum = np.cumsum(w)
    expect = np.minimum(np.searchsorted(cum, targets, side="right"), size - 1)
    assert np.mean(a == expect) > 0.99 and np.mean(b == expect) > 0.99
    assert np.mean(a == b) > 0.99


EDGES = {
    "zero": 0.0,
    "root": None,  # the total itself (rounding can produce it)
    "above-root": "above",
    "just-below-root": "below",
}


@pytest.mark.parametrize("edge", EDGES.values(), ids=EDGES.keys())
def test_find_prefix_edges_never_pick_zero_weight(edge):
    size = 1000
    w = np.zeros(size)
    w[[3, 40, 517]] = [0.1, 0.2, 0.3]  # trailing leaves of zero weight
    fast, slow = pair(size, "sum")
    for t in (fast, slow):
        t.set(np.arange(size), w)
    root = fast.root
    target = {None: root, "above": np.nextafter(root, 2.0), "below": np.nextafter(root, 0.0)}
    u = np.array([target.get(edge, edge)], dtype=np.float64)
    got = fast.find_prefix(u)
    assert w[got[0]] > 0
    expect = 3 if edge == 0.0 else 517
    assert got[0] == expect == slow.find_prefix(u)[0]


def test_find_prefix_boundaries_between_leaves():
    w = np.array([0.1, 0.0, 0.2, 0.0, 0.0, 0.3] * 60)
    fast, _ = pair(len(w), "sum")
    fast.set(np.arange(len(w)), w)
    cum = np.cumsum(w)
    got = fast.find_prefix(np.r_[cum[:-1], np.nextafter(cum[:-1], 0.0)])
    assert (w[got] > 0).all()


BAD_CALLS = {
    "levels-not-list": (
        lambda lv: (kernel.set_sum, (lv[0], np.zeros(1, np.int64), np.zeros(1))),
        TypeError,
    ),
    "idx-float": (lambda lv: (kernel.set_sum, (lv, np.zeros(1), np.zeros(1))), TypeError),
    "values-int": (
        lambda lv: (kernel.set_min, (lv, np.zeros(1, np.int64), np.zeros(1, np.int64))),
        TypeError,
    ),
    "length-mismatch": (
        lambda lv: (kernel.set_sum, (lv, np.zeros(2, np.int64), np.zeros(1))),
        ValueError,
    ),
    "idx-out-of-range": (
        lambda lv: (kernel.set_sum, (lv, np.array([0, 10**6]), np.ones(2))),
        ValueError,
    ),
    "idx-negative": (lambda lv: (kernel.set_sum, (lv, np.array([-1]), np.ones(1))), ValueError),
    "out-too-short": (
        lambda lv: (kernel.find_prefix, (lv, np.zeros(3), np.zeros(2, np.int64))),
        ValueError,
    ),
    "out-float": (lambda lv: (kernel.find_prefix, (lv, np.zeros(3), np.zeros(3))), TypeError),
    "level-readonly": (
        lambda lv: (
            kernel.set_sum,
            (
                [np.zeros(16)] * 0 + [lv[0], np.frombuffer(bytes(128))],
                np.zeros(1, np.int64),
                np.zeros(1),
            ),
        ),
        TypeError,
    ),
    "level-bad-size": (
        lambda lv: (kernel.set_sum, ([np.zeros(20)], np.zeros(1, np.int64), np.zeros(1))),
        ValueError,
    ),
    "levels-wrong-shape": (
        lambda lv: (kernel.set_sum, ([lv[0], np.zeros(32)], np.zeros(1, np.int64), np.zeros(1))),
        ValueError,
    ),
    "strided-targets": (
        lambda lv: (kernel.find_prefix, (lv, np.zeros(6)[::2], np.zeros(3, np.int64))),
        TypeError,
    ),
}


@pytest.mark.parametrize("make, error", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_buffers_raise_and_change_nothing(make, error):
    tree = KaryTree(300, "sum", use_kernel=True)
    tree.set(np.arange(300), np.ones(300))
    before = [level.copy() for level in tree.levels]
    fn, args = make(tree.levels)
    with pytest.raises(error):
        fn(*args)
    for a, b in zip(before, tree.levels):
        np.testing.assert_array_equal(a, b)


def test_find_prefix_on_empty_tree_raises():
    tree = KaryTree(40, "sum", use_kernel=True)
    with pytest.raises(ValueError, match="positive total"):
        kernel.find_prefix(tree.levels, np.zeros(2), np.zeros(2, np.int64))


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_sum_and_min_trees_updated_in_one_pass_match_the_numpy_path(size):
    rng = np.random.default_rng(size + 2)
    trees = []
    for use_kernel in (True, False):
        sums = KaryTree(size, "sum", use_kernel=use_kernel)
        trees.append((sums, KaryTree(size, "min", use_kernel=use_kernel, leaves=sums.levels[0])))
    for _ in range(20):
        k = int(rng.integers(1, max(2, size // 3) + 1))
        idx = rng.integers(0, size, k)
        values = rng.uniform(0.0, 3.0, k)
        values[rng.random(k) < 0.3] = 0.0  # weight 0: skipped by the min tree
        for sums, mins in trees:
            sums.set(idx, values, mins)
        (fast_sums, fast_mins), (slow_sums, slow_mins) = trees
        np.testing.assert_array_equal(fast_sums.leaves, slow_sums.leaves)
        assert fast_mins.root == slow_mins.root
        positive = fast_sums.leaves[fast_sums.leaves > 0]
        assert fast_mins.root == (positive.min() if len(positive) else np.inf)
        assert_parents_exact(fast_sums)


def test_min_levels_must_share_the_sum_trees_leaves():
    sums = KaryTree(300, "sum", use_kernel=True)
    own = KaryTree(300, "min", use_kernel=True)
    shared = KaryTree(300, "min", use_kernel=True, leaves=sums.levels[0])
    idx, values = np.array([3]), np.array([1.0])
    with pytest.raises(ValueError, match="same leaves"):
        kernel.set_sum(sums.levels, idx, values, own.levels)
    with pytest.raises(TypeError):
        kernel.set_min(shared.levels, idx, None, sums.levels)
    assert sums.root == 0.0


def tree_pair(size: int, use_kernel: bool) -> tuple[KaryTree, KaryTree]:
    sums = KaryTree(size, "sum", use_kernel=use_kernel)
    return sums, KaryTree(size, "min", use_kernel=use_kernel, leaves=sums.levels[0])


def assert_pairs_agree(trees) -> None:
    """The compiled (sum, min) pair equals the numpy pair: leaves and min trees exactly,
    sums to rounding, every compiled parent its children's sum."""
    (fast_sums, fast_mins), (slow_sums, slow_mins) = trees
    np.testing.assert_array_equal(fast_sums.levels[0], slow_sums.levels[0])
    for a, b in zip(fast_sums.levels, slow_sums.levels):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
    for a, b in zip(fast_mins.levels, slow_mins.levels):
        np.testing.assert_array_equal(a, b)
    assert_parents_exact(fast_sums)


# Batches over trees of every shape: near the root the kernel recomputes each shared parent
# once (levels of at most 64 nodes per leaf of the batch and 65,536 nodes); elsewhere (a
# tree of 1.1M leaves, small batches) once per leaf.
MANY_SIZES = {**SIZES, "wide-level": 1_100_000}


@pytest.mark.parametrize("size", MANY_SIZES.values(), ids=MANY_SIZES.keys())
def test_leaf_writer_set_many_matches_the_numpy_twin(size):
    rng = np.random.default_rng(size + 11)
    trees = [tree_pair(size, True), tree_pair(size, False)]
    writers = [sums.leaf_writer(mins) for sums, mins in trees]
    assert isinstance(writers[0], kernel.LeafWriter)
    assert isinstance(writers[1], sum_tree.LeafWriter)
    for batch in (1, 2, 256, 3000):  # large batches on small trees: many duplicates
        for _ in range(3):
            idx = rng.integers(0, size, batch)
            values = rng.uniform(0.0, 3.0, batch)
            values[rng.random(batch) < 0.2] = 0.0  # weight 0: left out of the min tree
            for writer in writers:
                writer.set_many(idx, values, 1.0)
            assert_pairs_agree(trees)


@pytest.mark.parametrize("exponent", [0.0, 0.6, 1.0, 2.5])
def test_leaf_writer_raises_priorities_to_the_exponent(exponent):
    """Leaves hold priority ** exponent (0 ** 0 is 1, as numpy's power gives it)."""
    rng = np.random.default_rng(12)
    for use_kernel in (True, False):
        sums, mins = tree_pair(700, use_kernel)
        idx = rng.permutation(700)[:300]
        priorities = rng.uniform(0.0, 4.0, 300)
        priorities[:20] = 0.0
        sums.leaf_writer(mins).set_many(idx, priorities, exponent)
        np.testing.assert_allclose(
            sums.levels[0][idx], np.power(priorities, exponent), rtol=1e-15, atol=0
        )
        assert_parents_exact(sums)
        positive = sums.leaves[sums.leaves > 0]
        assert mins.root == positive.min()


def test_leaf_writer_set_many_refuses_bad_writes_and_changes_nothing():
    sums, mins = tree_pair(300, True)
    writer = sums.leaf_writer(mins)
    writer.set_many(np.arange(300), np.ones(300), 1.0)
    before = [level.copy() for level in sums.levels + mins.levels]
    for args, error in [
        ((np.array([3, 304]), np.ones(2), 1.0), ValueError),  # the second out of range
        ((np.array([-1]), np.ones(1), 1.0), ValueError),
        ((np.array([3, 4]), np.ones(3), 1.0), ValueError),
        ((np.array([3.0]), np.ones(1), 1.0), TypeError),
        ((np.array([3]), np.ones(1, np.float32), 1.0), TypeError),
        ((np.array([3]), np.ones(1), "x"), TypeError),
        ((np.array([3]), np.ones(1)), TypeError),
    ]:
        with pytest.raises(error):
            writer.set_many(*args)
    for a, b in zip(before, sums.levels + mins.levels):
        np.testing.assert_array_equal(a, b)


def test_leaf_writer_keeps_its_trees():
    sums, mins = tree_pair(300, True)
    writer = kernel.LeafWriter(sums.levels, mins.levels)
    levels = sums.levels
    del sums, mins
    writer.set_many(np.array([5]), np.array([2.0]), 1.0)  # the writer holds the buffers
    assert levels[-1][0] == 2.0
    with pytest.raises(ValueError, match="same leaves"):
        kernel.LeafWriter(levels, KaryTree(300, "min").levels)
    with pytest.raises(TypeError):
        kernel.LeafWriter([np.zeros(16, np.float32)])
