"""Sampling distributions: chi-square tests, exact orders, probabilities and weights."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import rows
from scipy.stats import chisquare

from rlreplay import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Uniform

P_MIN = 1e-4  # a correct sampler fails this about once in 10,000 runs
DRAWS = 40_000


def draw_counts(table, n_items, draws=DRAWS):
    """How often each step id (0..n_items-1) is drawn in ``draws`` samples."""
    counts = np.zeros(n_items, dtype=np.int64)
    batch_size = table.max_size  # the largest batch a table serves
    for _ in range(-(-draws // batch_size)):
        batch = table.sample(batch_size)
        counts += np.bincount(batch.data["step"], minlength=n_items)
    return counts


def assert_distribution(counts, probs):
    """Chi-square goodness of fit of ``counts`` to ``probs`` (over items with prob > 0)."""
    probs = np.asarray(probs, dtype=np.float64)
    zero = probs == 0
    assert counts[zero].sum() == 0, "an item of probability 0 was drawn"
    observed = counts[~zero]
    expected = probs[~zero] / probs[~zero].sum() * observed.sum()
    assert expected.min() >= 5, "test design: expected counts too small for chi-square"
    p = chisquare(observed, expected).pvalue
    assert p > P_MIN, f"p={p:.3g}: counts {observed.tolist()} vs expected {expected.round(1)}"


def test_uniform_draws_every_item_equally(make_table):
    table = make_table(max_size=64, sampler=Uniform(), seed=1)
    table.insert(rows(0, 20), priorities=np.arange(1, 21))  # priorities must not matter
    assert_distribution(draw_counts(table, 20), np.ones(20))


def test_uniform_after_deletes_and_evictions_draws_only_held_items(make_table):
    table = make_table(max_size=24, capacity=24, sampler=Uniform(), seed=2)
    keys = table.insert(rows(0, 24))
    table.delete(keys[[1, 5, 6, 7, 20]])
    table.insert(rows(24, 6))  # overwrites steps 0..5 (ring of 24)
    held = np.zeros(30)
    held[[*range(8, 20), *range(21, 30)]] = 1
    assert_distribution(draw_counts(table, 30), held)


def test_uniform_would_fail_for_a_skewed_distribution(make_table):
    # The test has power: the same counts fail against a mildly different distribution.
    table = make_table(max_size=64, sampler=Uniform(), seed=3)
    table.insert(rows(0, 20))
    counts = draw_counts(table, 20)
    wrong = np.ones(20)
    wrong[0] = 1.3
    with pytest.raises(AssertionError):
        assert_distribution(counts, wrong)


PRIORITIES = 1.25 ** np.arange(16)  # 1 .. 28, skewed


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 1.7])
def test_prioritized_draws_in_proportion_to_priority_to_the_alpha(alpha, make_table):
    table = make_table(max_size=64, sampler=Prioritized(alpha), seed=4)
    table.insert(rows(0, 16), priorities=PRIORITIES)
    assert_distribution(draw_counts(table, 16), PRIORITIES**alpha)


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_prioritized_follows_updated_priorities(alpha, make_table):
    table = make_table(max_size=64, sampler=Prioritized(alpha), seed=5)
    keys = table.insert(rows(0, 16), priorities=PRIORITIES)
    new = PRIORITIES.copy()
    new[:8] = PRIORITIES[:8][::-1] * 3.0
    new[10] = 0.0
    assert table.update_priorities(keys[:11], new[:11]) == 11
    assert_distribution(draw_counts(table, 16), new**alpha)


def test_prioritized_after_deletes_and_overwrites_draws_only_held_items(make_table):
    table = make_table(max_size=16, capacity=16, sampler=Prioritized(0.8), seed=6)
    keys = table.insert(rows(0, 16), priorities=PRIORITIES)
    assert table.delete(keys[[3, 15]]) == 2
    table.insert(rows(16, 2), priorities=[50.0, 2.0])  # overwrites steps 0 and 1
    probs = np.zeros(18)
    probs[2:16] = PRIORITIES[2:16] ** 0.8
    probs[[3, 15]] = 0.0
    probs[16:] = np.array([50.0, 2.0]) ** 0.8
    assert_distribution(draw_counts(table, 18), probs)


def test_prioritized_would_fail_for_the_wrong_exponent(make_table):
    table = make_table(max_size=64, sampler=Prioritized(1.0), seed=7)
    table.insert(rows(0, 16), priorities=PRIORITIES)
    counts = draw_counts(table, 16)
    with pytest.raises(AssertionError):
        assert_distribution(counts, PRIORITIES**0.9)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_reported_probabilities_are_the_true_selection_probabilities(alpha, make_table):
    table = make_table(max_size=64, sampler=Prioritized(alpha), seed=8)
    prios = np.r_[PRIORITIES, 0.0]
    table.insert(rows(0, 17), priorities=prios)
    batch = table.sample(64)
    true = prios**alpha / (prios**alpha).sum() if alpha else np.ones(17) / 17
    if alpha == 0.0:  # 0 ** 0 == 1: the zero-priority item is sampled too
        true = np.ones(17) / 17
    np.testing.assert_allclose(batch.info.probabilities, true[batch.data["step"]], rtol=1e-12)
    np.testing.assert_allclose(batch.info.priorities, prios[batch.data["step"]])
    assert batch.info.table_size == 17


def test_uniform_reported_probabilities_are_one_over_size(make_table):
    table = make_table(max_size=64, sampler=Uniform(), seed=9)
    table.insert(rows(0, 10))
    batch = table.sample(32)
    np.testing.assert_allclose(batch.info.probabilities, 0.1)


# ------------------------------------------------------------ importance weights


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_importance_weights_equal_the_closed_form(beta, make_table):
    alpha = 0.6
    table = make_table(max_size=64, sampler=Prioritized(alpha), seed=10)
    table.insert(rows(0, 16), priorities=PRIORITIES)
    batch = table.sample(64)
    n = 16
    probs = PRIORITIES**alpha / (PRIORITIES**alpha).sum()
    raw = (n * probs[batch.data["step"]]) ** -beta
    np.testing.assert_allclose(batch.importance_weights(beta, "none"), raw, rtol=1e-12)
    np.testing.assert_allclose(batch.importance_weights(beta), raw / raw.max(), rtol=1e-12)
    table_max = (n * probs.min()) ** -beta
    np.testing.assert_allclose(batch.importance_weights(beta, "table"), raw / table_max, rtol=1e-12)
    assert batch.importance_weights(beta, "table").max() <= 1.0 + 1e-12


def test_table_normalised_weights_follow_deletes_and_updates(make_table):
    alpha, beta = 1.0, 0.5
    table = make_table(max_size=64, sampler=Prioritized(alpha), seed=11)
    keys = table.insert(rows(0, 16), priorities=PRIORITIES)
    table.delete(keys[:2])  # the two smallest priorities leave
    table.update_priorities(keys[5:6], [100.0])
    prios = PRIORITIES.copy()
    prios[5] = 100.0
    live = prios[2:]
    probs = live / live.sum()
    batch = table.sample(64)
    got = probs[batch.data["step"] - 2]
    expected = (14 * got) ** -beta / (14 * probs.min()) ** -beta
    np.testing.assert_allclose(batch.importance_weights(beta, "table"), expected, rtol=1e-12)
    np.testing.assert_allclose(batch.info.min_probability, probs.min(), rtol=1e-12)


def test_uniform_importance_weights_are_all_one(make_table):
    table = make_table(max_size=64, sampler=Uniform(), seed=12)
    table.insert(rows(0, 10))
    batch = table.sample(32)
    for normalize in ("batch", "table", "none"):
        np.testing.assert_allclose(batch.importance_weights(0.7, normalize), 1.0)


# ------------------------------------------------------------ deterministic orders

# (name, selector class, priorities of steps 0..5, expected order of step ids)
ORDERS = [
    ("fifo: oldest first", Fifo, [3, 1, 3, 2, 1, 2], [0, 1, 2, 3, 4, 5]),
    ("lifo: newest first", Lifo, [3, 1, 3, 2, 1, 2], [5, 4, 3, 2, 1, 0]),
    ("min heap: lowest first, ties oldest", MinHeap, [3, 1, 3, 2, 1, 2], [1, 4, 3, 5, 0, 2]),
    ("max heap: highest first, ties oldest", MaxHeap, [3, 1, 3, 2, 1, 2], [0, 2, 3, 5, 1, 4]),
]


@pytest.mark.parametrize("cls,prios,order", [c[1:] for c in ORDERS], ids=[c[0] for c in ORDERS])
def test_deterministic_sampler_order_one_by_one(cls, prios, order, make_table):
    table = make_table(max_size=16, sampler=cls(), max_times_sampled=1)
    table.insert(rows(0, 6), priorities=prios)
    got = [int(table.sample(1).data["step"][0]) for _ in range(6)]
    assert got == order
    assert table.size == 0


@pytest.mark.parametrize("cls,prios,order", [c[1:] for c in ORDERS], ids=[c[0] for c in ORDERS])
def test_deterministic_sampler_order_in_one_batch(cls, prios, order, make_table):
    table = make_table(max_size=16, sampler=cls(), max_times_sampled=1)
    table.insert(rows(0, 6), priorities=prios)
    assert table.sample(6).data["step"].tolist() == order


@pytest.mark.parametrize("cls", [Fifo, Lifo, MinHeap, MaxHeap])
def test_deterministic_sampler_without_limit_repeats_its_first_item(cls, make_table):
    table = make_table(max_size=16, sampler=cls())
    table.insert(rows(0, 6), priorities=[3, 1, 3, 2, 1, 2])
    steps = table.sample(5).data["step"]
    assert len(set(steps.tolist())) == 1
    np.testing.assert_array_equal(table.sample(5).info.times_sampled, np.arange(6, 11))


# (name, selector, priorities of steps 0..3, update (index, priority) or None, expected order)
TIE_UPDATES = [
    ("min heap: an update makes a tie most recent", MinHeap, [1, 1, 1, 5], (0, 1.0), [1, 2, 0, 3]),
    ("max heap: an update makes a tie most recent", MaxHeap, [5, 5, 1, 5], (1, 5.0), [0, 3, 1, 2]),
    ("min heap: update to a new lowest goes first", MinHeap, [2, 3, 4, 5], (3, 1.0), [3, 0, 1, 2]),
    ("fifo: updates do not reorder", Fifo, [1, 2, 3, 4], (0, 9.0), [0, 1, 2, 3]),
    ("lifo: updates do not reorder", Lifo, [1, 2, 3, 4], (3, 0.0), [3, 2, 1, 0]),
]


@pytest.mark.parametrize(
    "cls,prios,update,order", [c[1:] for c in TIE_UPDATES], ids=[c[0] for c in TIE_UPDATES]
)
def test_tie_breaking_after_updates(cls, prios, update, order, make_table):
    table = make_table(max_size=16, sampler=cls(), max_times_sampled=1)
    keys = table.insert(rows(0, 4), priorities=prios)
    i, p = update
    assert table.update_priorities(keys[i : i + 1], [p]) == 1
    assert [int(table.sample(1).data["step"][0]) for _ in range(4)] == order


def held_steps(table, keys):
    """Step ids (= insert order here) whose keys are still held; consumes the table."""
    return [i for i, k in enumerate(keys) if table.delete([k]) == 1]


# (name, remover, priorities of steps 0..4 inserted one by one into max_size=3, kept ids)
REMOVERS = [
    ("fifo evicts oldest", Fifo, [1, 2, 3, 4, 5], [2, 3, 4]),
    ("lifo evicts newest held", Lifo, [1, 2, 3, 4, 5], [0, 1, 4]),
    ("min heap evicts lowest held", MinHeap, [5, 1, 4, 3, 2], [0, 2, 4]),
    ("max heap evicts highest held", MaxHeap, [5, 1, 4, 3, 2], [1, 3, 4]),
    ("min heap ties evict oldest", MinHeap, [1, 1, 1, 1, 1], [2, 3, 4]),
    ("max heap ties evict oldest", MaxHeap, [1, 1, 1, 1, 1], [2, 3, 4]),
]


@pytest.mark.parametrize("cls,prios,kept", [c[1:] for c in REMOVERS], ids=[c[0] for c in REMOVERS])
def test_remover_evicts_in_order(cls, prios, kept, make_table):
    table = make_table(max_size=3, capacity=16, remover=cls())
    keys = [int(table.insert(rows(i, 1), priorities=[prios[i]])[0]) for i in range(5)]
    assert table.info().evictions == 2 and table.size == 3
    assert held_steps(table, keys) == kept


@pytest.mark.parametrize("cls,prios,kept", [c[1:] for c in REMOVERS], ids=[c[0] for c in REMOVERS])
def test_remover_evicts_in_order_for_a_batch_insert(cls, prios, kept, make_table):
    # Three items, then two in one batch: the two victims are chosen among the held three.
    table = make_table(max_size=3, capacity=16, remover=cls())
    keys = list(table.insert(rows(0, 3), priorities=prios[:3]))
    keys += list(table.insert(rows(3, 2), priorities=prios[3:]))
    victims = {
        Fifo: [0, 1],
        Lifo: [2, 1],
        MinHeap: list(np.lexsort((np.arange(3), prios[:3]))[:2]),
        MaxHeap: list(np.lexsort((np.arange(3), -np.array(prios[:3])))[:2]),
    }[cls]
    expected = sorted(set(range(5)) - {int(v) for v in victims})
    assert held_steps(table, keys) == expected


def test_prioritized_remover_never_evicts_a_zero_weight_item_before_positive_ones(make_table):
    table = make_table(max_size=4, capacity=16, remover=Prioritized(1.0), seed=13)
    keys = list(table.insert(rows(0, 4), priorities=[0.0, 1.0, 0.0, 2.0]))
    keys += list(table.insert(rows(4, 2), priorities=[1.0, 1.0]))
    assert held_steps(table, keys) == [0, 2, 4, 5]


@pytest.mark.parametrize("seed", range(5))
def test_prioritized_remover_evicts_distinct_items_when_positive_weights_run_out(seed, make_table):
    # Two victims are needed but only one item has positive weight: the second victim
    # must be a different, zero-weight item (never the first one again).
    table = make_table(max_size=3, capacity=16, remover=Prioritized(1.0), seed=seed)
    keys = list(table.insert(rows(0, 3), priorities=[1.0, 0.0, 0.0]))
    keys += list(table.insert(rows(3, 2), priorities=[1.0, 1.0]))
    assert table.size == 3 and table.info().evictions == 2
    kept = held_steps(table, keys)
    assert len(kept) == 3 and {3, 4} <= set(kept) and 0 not in kept


def consecutive_draws(weights, limit, n):
    """Every sequence of ``n`` consecutive single draws from items of ``weights``, each
    leaving once drawn ``limit`` times: ``{sequence: (probability, per-draw probabilities)}``."""
    out = {}

    def walk(seq, left, prob, each):
        if len(seq) == n:
            out[tuple(seq)] = (prob, tuple(each))
            return
        mass = sum(w for i, w in enumerate(weights) if left[i])
        for i, w in enumerate(weights):
            if left[i]:
                p = w / mass
                walk([*seq, i], {**left, i: left[i] - 1}, prob * p, [*each, p])

    walk([], dict.fromkeys(range(len(weights)), limit), 1.0, [])
    return out


# (name, priorities, max_times_sampled, batch size)
LIMITED_BATCHES = [
    ("each item once, batch of 2", [1.0, 2.0, 3.0], 1, 2),
    ("each item twice, batch of 4", [1.0, 2.0, 3.0], 2, 4),
    ("each item once, batch of all 3", [1.0, 2.0, 3.0], 1, 3),
]


@pytest.mark.parametrize(
    "prios,limit,n", [c[1:] for c in LIMITED_BATCHES], ids=[c[0] for c in LIMITED_BATCHES]
)
def test_a_limited_prioritized_batch_is_drawn_as_consecutive_single_samples(
    prios, limit, n, make_table
):
    """With max_times_sampled, a batch's sequences follow one-at-a-time draws in which an
    item leaves once it reaches the limit, and each draw reports the probability it had
    among the items left at that draw."""
    expected = consecutive_draws(prios, limit, n)
    table = make_table(max_size=8, sampler=Prioritized(1.0), max_times_sampled=limit, seed=3)
    counts = dict.fromkeys(expected, 0)
    for _ in range(6_000):
        table.insert(rows(0, len(prios)), priorities=prios)
        batch = table.sample(n)
        seq = tuple(batch.data["step"].tolist())
        np.testing.assert_allclose(batch.info.probabilities, expected[seq][1])
        counts[seq] += 1
        table.reset()
    # Sequences expected fewer than 5 times are pooled into one cell for the chi-square.
    total = sum(counts.values())
    small = [s for s in expected if expected[s][0] * total < 5]
    cells = [s for s in expected if s not in small]
    observed = [counts[s] for s in cells]
    probs = [expected[s][0] for s in cells]
    if small:
        observed.append(sum(counts[s] for s in small))
        probs.append(sum(expected[s][0] for s in small))
    p = chisquare(observed, np.asarray(probs) * total).pvalue
    assert p > P_MIN, f"p={p:.3g}: {dict(zip(cells, observed))}"
