"""Property tests: random operation sequences against a plain-Python model of the table."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROW_SIGNATURE, rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rlreplay import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Table, Uniform
from rlreplay.core.selectors.sum_tree import FANOUT, KaryTree

PRIORITY = st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=100.0))


class PrioritizedTableModel(RuleBasedStateMachine):
    """A table with a small ring (wraps often), a Prioritized sampler and a Fifo remover.

    The model holds, per live key, the step id stored with it and its priority, in
    insertion order (the Fifo remover's order).
    """

    @initialize(
        capacity=st.integers(2, 7),
        spare=st.integers(0, 3),
        alpha=st.sampled_from([0.0, 0.5, 1.0, 1.5]),
        max_times_sampled=st.sampled_from([0, 0, 1, 2]),
        seed=st.integers(0, 2**16),
    )
    def setup(self, capacity, spare, alpha, max_times_sampled, seed):
        self.capacity = capacity
        self.max_times_sampled = max_times_sampled
        self.max_size = max(1, capacity - spare)
        self.alpha = alpha
        self.table = Table(
            "p",
            signature=ROW_SIGNATURE,
            capacity=capacity,
            max_size=self.max_size,
            sampler=Prioritized(alpha),
            remover=Fifo(),
            max_times_sampled=max_times_sampled,
            seed=seed,
        )
        self.times: dict[int, int] = {}  # key -> times sampled
        self.items: dict[int, tuple[int, float]] = {}  # key -> (step id, priority)
        self.issued: list[int] = []
        self.next_step = 0
        self.max_priority = 1.0

    def weight(self, p):
        return p**self.alpha

    # ------------------------------------------------------------------ rules
    @rule(data=st.data(), n=st.integers(1, 4))
    def insert(self, data, n):
        n = min(n, self.max_size)
        given_priorities = data.draw(st.booleans())
        prios = data.draw(st.lists(PRIORITY, min_size=n, max_size=n)) if given_priorities else None
        first = self.next_step
        keys = self.table.insert(rows(first, n), priorities=prios)
        # Model: the ring overwrites rows of steps first-capacity .. first+n-1-capacity.
        overwritten = set(range(first - self.capacity, first + n - self.capacity))
        for key in [k for k, (s, _) in self.items.items() if s in overwritten]:
            del self.items[key]
        excess = len(self.items) + n - self.max_size
        for key in list(self.items)[: max(0, excess)]:  # Fifo: oldest first
            del self.items[key]
        if prios is None:
            prios = [self.max_priority] * n
        else:
            self.max_priority = max(self.max_priority, *prios)
        for j, key in enumerate(keys.tolist()):
            assert key not in self.items
            self.items[key] = (first + j, float(prios[j]))
            self.times[key] = 0
        self.issued.extend(keys.tolist())
        self.next_step += n

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def sample(self, data):
        weights = {k: self.weight(p) for k, (_, p) in self.items.items()}
        total = sum(weights.values())
        if total == 0:
            return
        n = data.draw(st.integers(1, self.max_size))
        mts = self.max_times_sampled
        batch = self.table.sample(n, timeout=1.0)
        if mts:  # a batch ends early only when nothing drawable is left
            budget = sum(mts - self.times[k] for k in self.items if weights[k] > 0)
            assert len(batch) == min(n, budget)
        else:
            assert len(batch) == n
        for key, step, prob, prio in zip(
            batch.info.keys.tolist(),
            batch.data["step"].tolist(),
            batch.info.probabilities,
            batch.info.priorities,
        ):
            assert key in self.items, "sampled an item that is not held"
            model_step, model_prio = self.items[key]
            assert step == model_step, f"served step {step} for key of step {model_step}"
            assert step >= self.next_step - self.capacity, "served an overwritten step"
            assert weights[key] > 0
            if not mts:  # with max_times_sampled, exhausted items leave the distribution
                assert prob == pytest.approx(weights[key] / total, rel=1e-9)
            assert prio == model_prio
        for key, t in zip(batch.info.keys.tolist(), batch.info.times_sampled.tolist()):
            self.times[key] += 1
            assert t == self.times[key], "times_sampled skipped or repeated a count"
            assert not mts or t <= mts
        for key in set(batch.info.keys.tolist()):
            if mts and self.times[key] >= mts:
                del self.items[key]
        np.testing.assert_array_equal(
            batch.data["obs"], np.repeat(batch.data["step"][:, None], 3, 1)
        )

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def update(self, data):
        keys = data.draw(st.lists(st.sampled_from(self.issued), min_size=1, max_size=6))
        prios = data.draw(st.lists(PRIORITY, min_size=len(keys), max_size=len(keys)))
        applied = {}
        for k, p in zip(keys, prios):
            if k in self.items:
                applied[k] = p  # duplicates: the last wins
        stale_before = self.table.info().stale_updates
        assert self.table.update_priorities(np.array(keys), prios) == len(applied)
        assert self.table.info().stale_updates - stale_before == sum(
            k not in self.items for k in keys
        )
        for k, p in applied.items():
            self.items[k] = (self.items[k][0], p)
        if applied:
            self.max_priority = max(self.max_priority, *applied.values())

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def delete(self, data):
        keys = data.draw(st.lists(st.sampled_from(self.issued), min_size=1, max_size=4))
        live = {k for k in keys if k in self.items}
        assert self.table.delete(np.array(keys)) == len(live)
        for k in live:
            del self.items[k]

    @rule()
    def reset(self):
        self.table.reset()
        self.items.clear()
        self.max_priority = 1.0

    # ------------------------------------------------------------- invariants
    @invariant()
    def sum_tree_matches_live_priorities(self):
        sampler = self.table.sampler
        expected = sum(self.weight(p) for _, p in self.items.values())
        assert sampler.sums.root == pytest.approx(expected, rel=1e-9, abs=1e-12)
        leaves = np.zeros(self.capacity)
        for key, (_, p) in self.items.items():
            leaves[key & 0xFFFFFFFF] = self.weight(p)
        np.testing.assert_allclose(sampler.sums.leaves, leaves, rtol=1e-12)
        # The min tree holds exactly the smallest positive leaf it stores (the leaves
        # themselves match the model's p ** alpha to rounding, checked just above).
        stored = sampler.sums.leaves[: self.capacity]
        positive = stored[stored > 0]
        assert sampler.mins.root == (positive.min() if len(positive) else np.inf)

    @invariant()
    def sizes_agree(self):
        info = self.table.info()
        assert info.size == len(self.table) == len(self.items) == self.table.sampler.size
        if self.table.index.remover_active:  # else idle: max_size reaches capacity
            assert self.table.remover.size == len(self.items)
        assert self.table.index.remover_active == (self.max_size < self.capacity)
        assert info.size <= self.max_size
        assert self.table.store.next_id == self.next_step


PrioritizedTableModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPrioritizedTableModel = PrioritizedTableModel.TestCase


# ------------------------------------------------------------------ KaryTree


@settings(max_examples=80, deadline=None)
@given(
    size=st.sampled_from([1, 2, 15, 16, 17, 255, 256, 257, 1000, 5000]),
    seed=st.integers(0, 2**16),
    rounds=st.integers(1, 4),
)
def test_kary_tree_sums_and_minima_match_numpy(size, seed, rounds):
    rng = np.random.default_rng(seed)
    sums, mins = KaryTree(size, "sum"), KaryTree(size, "min")
    leaves = np.zeros(size)
    min_leaves = np.zeros(size)
    for _ in range(rounds):
        k = int(rng.integers(1, max(2, size // 3) + 1))
        idx = rng.integers(0, size, k)  # duplicates allowed: the last value wins
        values = rng.integers(0, 6, k).astype(np.float64)
        sums.set(idx, values)
        mins.set(idx, values)
        leaves[idx] = values
        min_leaves[idx] = values
        assert sums.root == leaves.sum()  # integer leaves: exact
        positive = min_leaves[min_leaves > 0]  # a min tree skips leaves of weight 0
        assert mins.root == (positive.min() if len(positive) else np.inf)
        np.testing.assert_array_equal(sums.leaves, leaves)
        # Every internal node is the sum of its 16 children.
        for lower, upper in zip(sums.levels, sums.levels[1:]):
            np.testing.assert_array_equal(
                upper[: len(lower) // FANOUT], lower.reshape(-1, FANOUT).sum(axis=1)
            )
    single = int(rng.integers(0, size))
    sums.set(np.array([single]), np.array([3.0]))
    leaves[single] = 3.0
    assert sums.root == leaves.sum()
    rebuilt = KaryTree(size, "sum")
    rebuilt.leaves[:] = leaves
    rebuilt.rebuild()
    for a, b in zip(rebuilt.levels, sums.levels):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=80, deadline=None)
@given(
    size=st.sampled_from([1, 3, 16, 17, 300, 4097, 20000]),
    seed=st.integers(0, 2**16),
    zero_fraction=st.sampled_from([0.0, 0.5, 0.95]),
)
def test_kary_tree_find_prefix_matches_searchsorted(size, seed, zero_fraction):
    rng = np.random.default_rng(seed)
    leaves = rng.integers(1, 9, size).astype(np.float64)
    leaves[rng.random(size) < zero_fraction] = 0.0
    if leaves.sum() == 0:
        leaves[int(rng.integers(0, size))] = 1.0
    tree = KaryTree(size, "sum")
    tree.set(np.arange(size), leaves)
    cum = np.cumsum(leaves)
    total = cum[-1]
    # Random targets, every boundary, just below each boundary, 0 and just below the total.
    targets = np.r_[
        rng.random(500) * total, cum[:-1], np.nextafter(cum, 0.0), 0.0, np.nextafter(total, 0)
    ]
    targets = targets[(targets >= 0) & (targets < total)]
    got = tree.find_prefix(targets)
    expected = np.searchsorted(cum, targets, side="right")
    np.testing.assert_array_equal(got, expected)
    assert (leaves[got] > 0).all()


def test_kary_tree_find_prefix_never_returns_a_zero_leaf_under_rounding():
    # Float weights whose partial sums round: targets at and just below the total.
    rng = np.random.default_rng(0)
    size = 3000
    leaves = rng.random(size) ** 8
    leaves[-200:] = 0.0
    tree = KaryTree(size, "sum")
    tree.set(np.arange(size), leaves)
    total = tree.root
    targets = np.r_[np.nextafter(total, 0.0), total * (1 - 1e-16), rng.random(2000) * total]
    got = tree.find_prefix(targets)
    assert (leaves[got] > 0).all() and (got < size - 200).all()


# ------------------------------------------------------------------ selectors

SELECTOR_CLASSES = {
    "Fifo": Fifo,
    "Lifo": Lifo,
    "MinHeap": MinHeap,
    "MaxHeap": MaxHeap,
    "Uniform": Uniform,
}


@settings(max_examples=120, deadline=None)
@given(
    name=st.sampled_from(sorted(SELECTOR_CLASSES)),
    capacity=st.sampled_from([1, 5, 17, 40, 300]),
    seed=st.integers(0, 2**16),
    n_ops=st.integers(1, 25),
)
def test_selectors_agree_with_a_model_after_random_batches(name, capacity, seed, n_ops):
    rng = np.random.default_rng(seed)
    sel = SELECTOR_CLASSES[name]()
    sel.bind(capacity)
    model: dict[int, tuple[float, int]] = {}  # slot -> (priority, insertion/update stamp)
    inserted: dict[int, int] = {}  # slot -> insertion stamp (Fifo/Lifo ignore updates)
    stamp = 0
    for _ in range(n_ops):
        free = np.array(sorted(set(range(capacity)) - set(model)), dtype=np.int64)
        held = np.array(sorted(model), dtype=np.int64)
        op = rng.integers(0, 3)
        if op == 0 and len(free):
            slots = rng.permutation(free)[: rng.integers(1, len(free) + 1)]
            prios = rng.integers(0, 4, len(slots)).astype(np.float64)
            sel.insert(slots, prios)
            for s, p in zip(slots.tolist(), prios.tolist()):
                model[s] = (p, stamp)
                inserted[s] = stamp
                stamp += 1
        elif op == 1 and len(held):
            slots = rng.permutation(held)[: rng.integers(1, len(held) + 1)]
            prios = rng.integers(0, 4, len(slots)).astype(np.float64)
            sel.update(slots, prios)
            for s, p in zip(slots.tolist(), prios.tolist()):
                model[s] = (p, stamp)
                stamp += 1
        elif len(held):
            slots = rng.permutation(held)[: rng.integers(1, len(held) + 1)]
            sel.delete(slots)
            for s in slots.tolist():
                del model[s]
                del inserted[s]
        assert sel.size == len(model)
        if not model:
            continue
        if name == "Uniform":
            assert sorted(sel.held().tolist()) == sorted(model)
            assert set(sel.sample(20, rng)[0].tolist()) <= set(model)
            continue
        if name in ("Fifo", "Lifo"):
            order = sorted(inserted, key=inserted.get, reverse=name == "Lifo")
        else:
            sign = 1.0 if name == "MinHeap" else -1.0
            order = sorted(model, key=lambda s: (sign * model[s][0], model[s][1]))
        assert sel.first(len(model)).tolist() == order
        assert sel.first(1).tolist() == order[:1]
        assert sel.sample(3, rng)[0].tolist() == order[:1] * 3


# ------------------------------------------------------ shared store, writers

EPISODE_SIGNATURE = {"step": "int64", "episode": "int64", "obs": ((2,), "float32")}


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(3, 12),
    seed=st.integers(0, 2**16),
    ops=st.lists(st.sampled_from(["step", "step", "step", "end", "sample", "update"]), max_size=60),
)
def test_tables_sharing_a_wrapping_store_never_serve_overwritten_or_cross_episode_data(
    capacity, seed, ops
):
    from rlreplay import ItemLayout, StepStore, TrajectoryWriter

    store = StepStore(EPISODE_SIGNATURE, capacity=capacity)
    sig = store.signature
    transitions = Table(
        "tr",
        store=store,
        layout=ItemLayout.transition(sig, next_fields=("obs", "step", "episode")),
        sampler=Prioritized(0.6),
        seed=seed,
    )
    sequences = Table("seq", store=store, layout=ItemLayout.sequence(sig, 3), seed=seed + 1)
    writer = TrajectoryWriter([transitions, sequences])
    rng = np.random.default_rng(seed)
    step_id, episode, in_episode = 0, 0, 0
    keys: list[int] = []
    for op in ops:
        if op == "step":
            writer.append({"step": step_id, "episode": episode, "obs": [step_id, episode]})
            step_id += 1
            in_episode += 1
            if in_episode >= 2:
                keys.append(writer.create_item(transitions, priority=float(rng.uniform(0, 2))))
            if in_episode >= 3:
                writer.create_item(sequences)
        elif op == "end":
            writer.end_episode()
            episode += 1
            in_episode = 0
        elif op == "update" and keys:
            chosen = rng.choice(keys, size=min(3, len(keys)))
            transitions.update_priorities(chosen, rng.uniform(0, 2, len(chosen)))
        elif op == "sample":
            oldest = store.oldest_id
            if transitions.size and transitions.sampler.sums.root > 0:
                b = transitions.sample(min(4, transitions.max_size), timeout=1.0).data
                assert (b["step"] >= oldest).all()
                np.testing.assert_array_equal(b["next_step"], b["step"] + 1)
                np.testing.assert_array_equal(b["next_episode"], b["episode"])
                np.testing.assert_array_equal(b["obs"][:, 0], b["step"])
            if sequences.size:
                b = sequences.sample(min(4, sequences.max_size), timeout=1.0).data
                s, e = b["step"], b["episode"]
                assert (s >= oldest).all()
                np.testing.assert_array_equal(s - s[:, :1], np.broadcast_to(np.arange(3), s.shape))
                assert (e == e[:, :1]).all()
                np.testing.assert_array_equal(b["obs"][..., 1], e)
        # Every held item's steps are all stored: sizes never exceed what the ring holds.
        assert transitions.size <= max(0, store.num_steps - 1)
        assert sequences.size <= max(0, store.num_steps - 2)
