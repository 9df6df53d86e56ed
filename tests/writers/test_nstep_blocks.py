"""A batched n-step adder records its calls in blocks and settles them a block at a time
(:mod:`rlreplay.writers.nstep_blocks`): the tables must then hold exactly what the
per-call path stores (same rows, same items in the same order, same counters), over
random episode ends, truncations, both autoreset modes, frame stacks, chunk lengths,
block sizes and the calls that settle a block early (flush, end_episode, reset, a call
where some environments do not step)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlreplay import Fifo, NStepTransitionAdder, Table
from rlreplay.core._compiled import kernel_status
from rlreplay.writers.nstep_blocks import NStepBlock

PLAN = kernel_status(["rlreplay.writers._blocks"])[0]
needs_plan = pytest.mark.skipif(not PLAN.active, reason="the compiled plan is not built")

SIG = NStepTransitionAdder.signature(
    obs=((2,), "float32"), action="int64", extras={"version": "int64"}
)


class PerCallAdder(NStepTransitionAdder):
    """The reference: every call goes through the per-call path."""

    def _new_block(self, every):
        return None


def play(cls, case: dict) -> tuple[list[dict], dict]:
    """Feed ``case``'s steps to an adder of class ``cls``; the table's items oldest first
    and the adder's counters."""
    n, stack, num_envs, mode = case["n"], case["stack"], case["num_envs"], case["mode"]
    table = Table(
        "replay",
        signature=SIG,
        capacity=case.get("capacity", 1 << 15),  # small: pieces staged one by one
        layout=NStepTransitionAdder.layout(SIG, n, stack=stack),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = cls(
        table,
        n=n,
        discount=0.9,
        stack=stack,
        num_envs=num_envs,
        autoreset_mode=mode,
        chunk_length=case["chunk"],
        hand_over_every=case["every"],
    )
    rng = np.random.default_rng(case["seed"])
    counter = iter(range(1, 1 << 30))

    def observe(k: int) -> np.ndarray:
        return np.array([[next(counter), 0.5] for _ in range(k)], np.float32)

    adder.reset(observe(num_envs))
    p_term, p_trunc = case["p_term"], case["p_trunc"]
    for t in range(case["steps"]):
        action = rng.integers(5, size=num_envs)
        reward = rng.normal(size=num_envs).astype(np.float32)
        term = rng.random(num_envs) < p_term
        trunc = (rng.random(num_envs) < p_trunc) & ~term
        next_obs = observe(num_envs)
        info = {}
        if mode == "same_step" and (term | trunc).any():
            info = {"final_obs": observe(num_envs)}
        extras = {"version": np.full(num_envs, t, np.int64)}
        adder.add(action, reward, next_obs, term, trunc, info, extras=extras)
        op = case["ops"].get(t)
        if op == "flush":
            adder.flush()
        elif op == "end_episode":
            adder.end_episode(bool(t % 2), [t % num_envs])
            adder.reset(observe(1), [t % num_envs])
        elif op == "reset":
            adder.reset(observe(1), [t % num_envs])
        elif op == "end_then_reset" and num_envs > 1:  # env 0 does not step for a while
            adder.end_episode(False, [0])
            for _ in range(2):
                action = rng.integers(5, size=num_envs)
                adder.add(
                    action,
                    np.ones(num_envs),
                    observe(num_envs),
                    np.zeros(num_envs, bool),
                    np.zeros(num_envs, bool),
                    {"final_obs": observe(num_envs)} if mode == "same_step" else {},
                    extras={"version": action},
                )
            adder.reset(observe(1), [0])
    adder.close()
    items = table.sample(table.size).data if table.size else {}
    counters = {
        c: getattr(adder, c) for c in ("appended_rows", "copied_rows", "items_created", "episodes")
    }
    return items, counters


cases = st.fixed_dictionaries(
    {
        "n": st.integers(1, 4),
        "stack": st.integers(1, 3),
        "num_envs": st.integers(1, 6),
        "mode": st.sampled_from(["next_step", "same_step"]),
        "chunk": st.sampled_from([3, 4, 8, 64]),
        "every": st.integers(1, 9),
        "seed": st.integers(0, 2**16),
        "p_term": st.sampled_from([0.0, 0.05, 0.3, 0.7]),
        "p_trunc": st.sampled_from([0.0, 0.1, 0.5]),
        "steps": st.integers(0, 60),
        "capacity": st.sampled_from([1 << 15, 1 << 15, 512]),
        "ops": st.dictionaries(
            st.integers(0, 59),
            st.sampled_from(["flush", "end_episode", "reset", "end_then_reset"]),
            max_size=3,
        ),
    }
)


def assert_same(case: dict) -> None:
    """Blocks settled by the compiled plan store what the per-call path does."""
    want, want_counters = play(PerCallAdder, case)
    got, got_counters = play(NStepTransitionAdder, case)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert got_counters == want_counters


@needs_plan
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_block_path_stores_what_the_per_call_path_stores(case):
    assert_same(case)


@needs_plan
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
@pytest.mark.parametrize("stack", [1, 2])
def test_block_path_over_many_short_episodes_and_long_ones(mode, stack):
    """Episodes of one step next to episodes that fill several chunks, over blocks of
    the default size."""
    for p_term in (0.9, 0.02):
        assert_same(
            {
                "n": 3,
                "stack": stack,
                "num_envs": 16,
                "mode": mode,
                "chunk": 4,
                "every": 16,
                "seed": 7,
                "p_term": p_term,
                "p_trunc": 0.05,
                "steps": 150,
                "ops": {},
            }
        )


@pytest.mark.parametrize("side, blocks", [(16, True), (32, False), (84, False)])
def test_adders_of_large_rows_take_the_per_call_path(side, blocks):
    """A block copies held rows in and out: images take the per-call path (items alike)."""
    sig = NStepTransitionAdder.signature(obs=((side, side), "uint8"), action="int64")
    table = Table("t", signature=sig, capacity=4096, layout=NStepTransitionAdder.layout(sig, 2))
    adder = NStepTransitionAdder(table, n=2, discount=0.9, num_envs=4)
    assert (adder._block is not None) == (blocks and PLAN.active)


def test_a_batched_nstep_adder_records_its_calls_in_blocks_where_the_plan_is_built():
    table = Table("t", signature=SIG, capacity=4096, layout=NStepTransitionAdder.layout(SIG, 2))
    adder = NStepTransitionAdder(table, n=2, discount=0.9, num_envs=4)
    # Where the kernel is not built or is disabled, every call takes the per-call path.
    assert isinstance(adder._block, NStepBlock) == PLAN.active
    assert (adder._block is None) == (not PLAN.active)
    assert PerCallAdder(table, n=2, discount=0.9, num_envs=4)._block is None


@pytest.mark.parametrize("cls", [PerCallAdder, NStepTransitionAdder])
def test_a_new_episode_with_padding_rows_is_cut_once_it_holds_a_chunk(cls):
    """Padding rows (frame stacks) count as complete: an episode started by reset() is
    cut at the first call where its rows fill a chunk, even when the other episodes were
    all just cut (they need several more calls: the per-call path skipped its check)."""
    table = Table("t", signature=SIG, capacity=4096, layout=NStepTransitionAdder.layout(SIG, 1, 3))
    adder = cls(table, n=1, discount=0.9, stack=3, num_envs=2, chunk_length=3, hand_over_every=1)
    obs = np.zeros((2, 2), np.float32)
    adder.reset(obs)
    no = np.zeros(2, bool)
    step = (np.zeros(2, np.int64), np.ones(2, np.float32), obs, no, no)
    for _ in range(5):
        adder.add(*step, extras={"version": np.zeros(2, np.int64)})
    adder.reset(obs[:1] + 1, [0])  # truncates env 0's episode, starts a new one
    before = adder.appended_rows
    adder.add(*step, extras={"version": np.zeros(2, np.int64)})
    adder.add(*step, extras={"version": np.zeros(2, np.int64)})
    # two padding rows and the first step's row, complete once the second step is
    # taken: a chunk of 3 complete rows (env 1's rows need more calls)
    assert adder.appended_rows - before == 3


def queue_play(cls, mode: str, queue_size: int, consume_every: int, seed: int):
    """N-step items through a queue of ``queue_size`` drained every ``consume_every``
    calls (0: a queue large enough never to block); the items taken, oldest first, and
    the timeouts met."""
    from rlreplay import RateLimiterTimeoutError

    size = queue_size or 1 << 14
    queue = Table.queue("q", size, signature=SIG, layout=NStepTransitionAdder.layout(SIG, 2))
    adder = cls(
        queue, n=2, discount=0.9, num_envs=4, autoreset_mode=mode, timeout=0.002, hand_over_every=5
    )
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(4, 2)).astype(np.float32)
    adder.reset(obs)
    taken, timeouts = [], 0

    def drain():
        while queue.size:
            data = queue.sample(1).data
            taken.append((data["obs"][0].tolist(), float(data["reward"][0])))

    for t in range(80):
        term = rng.random(4) < 0.2
        next_obs = rng.normal(size=(4, 2)).astype(np.float32)
        info = (
            {"final_obs": rng.normal(size=(4, 2)).astype(np.float32)}
            if (mode == "same_step" and term.any())
            else {}
        )
        try:
            adder.add(
                rng.integers(5, size=4),
                rng.normal(size=4).astype(np.float32),
                next_obs,
                term,
                np.zeros(4, bool),
                info,
                extras={"version": np.full(4, t)},
            )
        except RateLimiterTimeoutError:
            timeouts += 1
        if consume_every and t % consume_every == consume_every - 1:
            drain()
    for _ in range(400):
        try:
            adder.close()
            break
        except RateLimiterTimeoutError:
            timeouts += 1
            drain()
    drain()
    return taken, timeouts


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
@pytest.mark.parametrize("seed", [0, 1])
def test_blocks_through_a_queue_that_times_out_give_the_items_of_a_writer_that_never_waits(
    mode, seed
):
    """Settled blocks whose hand-over the queue refuses stay pending, in order, and go
    over once it has room: the items taken are those of the per-call path into a queue
    that never blocks."""
    want, none = queue_play(PerCallAdder, mode, 0, 0, seed)
    got, timeouts = queue_play(NStepTransitionAdder, mode, 24, 7, seed)
    assert none == 0 and timeouts > 0, "the queue must have blocked the adder"
    assert got == want
