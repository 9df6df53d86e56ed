"""An adder whose writer times out (a full queue nobody drains yet) keeps the step and
the rows and items it could not hand over, and hands them over, in order and once,
when the writer has room again."""

from __future__ import annotations

import numpy as np
import pytest
from counting_env import make_vec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_nstep_adder import MinimalWriter

from rlreplay import (
    ClosedError,
    Fifo,
    NStepTransitionAdder,
    RateLimiterTimeoutError,
    SequenceAdder,
    SequenceItems,
    Table,
    TrajectoryWriter,
)

SIG = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")


def tables(queue_size: int) -> tuple[Table, Table]:
    """An n-step table (read once, oldest first) and a FIFO queue of sequences over its
    store."""
    layout = NStepTransitionAdder.layout(SIG, 2)
    replay = Table(
        "replay", signature=SIG, capacity=4096, layout=layout, sampler=Fifo(), max_times_sampled=1
    )
    queue = Table.queue(
        "queue", queue_size, store=replay.store, layout=SequenceAdder.layout(SIG, 3, pad_end=True)
    )
    return replay, queue


def drain(queue: Table, out: list) -> None:
    """Take every waiting item of the queue, oldest first."""
    while queue.size:
        data = queue.sample(1).data
        out.append((data["obs"][0].copy(), data["action"][0].copy()))


def play(mode, queue_size, minimal, consume, seed=9, chunk=2):
    """Feed CountingEnv steps to an adder over a table and a queue of ``queue_size``
    sequences, taking the queue's items after step ``t`` when ``consume(t)``."""
    envs, obs = make_vec(2, mode, seed=seed, max_len=6)
    replay, queue = tables(queue_size)
    history = 64
    writer = (
        MinimalWriter([replay, queue], history)
        if minimal
        else TrajectoryWriter([replay, queue], history=history)
    )
    adder = NStepTransitionAdder(
        writer,
        n=2,
        discount=0.9,
        num_envs=2,
        autoreset_mode=mode,
        chunk_length=chunk,
        timeout=0.003,
        tables=[replay],
        sequence_tables={queue: SequenceItems(3, 2)},
    )
    adder.reset(obs)
    rng = np.random.default_rng(seed)
    taken: list = []
    timeouts = 0
    for t in range(60):
        action = rng.integers(5, size=2)
        obs, reward, term, trunc, info = envs.step(action)
        try:
            adder.add(action, reward, obs, term, trunc, info)
        except RateLimiterTimeoutError:
            timeouts += 1
            assert adder.pending_chunks > 0
        if consume(t):
            drain(queue, taken)
    for _ in range(100):  # close: hand over what is left, making room as needed
        try:
            adder.close()
            break
        except RateLimiterTimeoutError:
            drain(queue, taken)
    drain(queue, taken)
    envs.close()
    assert adder.pending_chunks == 0
    data = replay.sample(replay.size).data if replay.size else {}
    order = np.lexsort(data["obs"].T[::-1]) if replay.size else []
    return {k: v[order] for k, v in data.items()}, taken, timeouts, adder


@pytest.mark.parametrize("minimal", [False, True], ids=["TrajectoryWriter", "declared_interface"])
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_items_after_writer_timeouts_equal_those_of_a_writer_that_never_waits(mode, minimal):
    timeouts = check_same_as_never_waiting(mode, 6, minimal, lambda t: t % 7 == 0)
    assert timeouts > 3, "the queue must have blocked the adder"


def check_same_as_never_waiting(mode, queue_size, minimal, consume, seed=9, chunk=2) -> int:
    """Items of a run whose queue blocks equal those of a run that never waits (the same
    items in the same order). Returns the timeouts the blocking run met."""
    expected, expected_taken, none, ref = play(mode, 4096, minimal, bool, seed, chunk)
    assert none == 0
    replay, taken, timeouts, adder = play(mode, queue_size, minimal, consume, seed, chunk)
    for key in expected:
        np.testing.assert_array_equal(replay[key], expected[key], err_msg=key)
    assert len(taken) == len(expected_taken) > 0
    for (obs, action), (want_obs, want_action) in zip(taken, expected_taken):
        np.testing.assert_array_equal(obs, want_obs)
        np.testing.assert_array_equal(action, want_action)
    assert (adder.items_created, adder.appended_rows) == (ref.items_created, ref.appended_rows)
    return timeouts


@settings(max_examples=15, deadline=None)
@given(
    mode=st.sampled_from(["next_step", "same_step"]),
    minimal=st.booleans(),
    seed=st.integers(0, 1000),
    queue_size=st.integers(6, 9),
    chunk=st.integers(1, 3),
    schedule=st.lists(st.booleans(), min_size=60, max_size=60),
)
def test_any_consumption_schedule_gives_the_items_of_a_writer_that_never_waits(
    mode, minimal, seed, queue_size, chunk, schedule
):
    check_same_as_never_waiting(mode, queue_size, minimal, lambda t: schedule[t], seed, chunk)


def test_a_timeout_keeps_the_step_and_the_next_call_hands_it_over():
    replay, queue = tables(1)
    adder = NStepTransitionAdder(
        [replay, queue],
        n=2,
        discount=0.9,
        num_envs=None,
        chunk_length=1,
        timeout=0.005,
        tables=[replay],
        sequence_tables={queue: SequenceItems(3, 3)},
    )
    adder.reset(np.zeros(3, np.float32))
    taken: list = []
    t = 0
    for t in range(1, 30):
        try:
            adder.add(t, 1.0, np.full(3, t, np.float32), False, False)
        except RateLimiterTimeoutError:
            break
    else:
        pytest.fail("the queue of one item never blocked")
    assert adder.pending_chunks >= 1
    drain(queue, taken)
    adder.flush()  # hands the kept chunk over: the queue had room for its item
    assert adder.pending_chunks == 0
    drain(queue, taken)
    adder.add(t + 1, 1.0, np.full(3, t + 1, np.float32), True, False)  # the step is not repeated
    drain(queue, taken)
    steps = replay.sample(replay.size).data["obs"][:, 0]
    np.testing.assert_array_equal(steps, np.arange(t + 1))  # every step once, in order
    starts = [int(obs[0, 0]) for obs, _ in taken]
    assert starts == list(range(0, 3 * len(starts), 3)) and len(starts) >= 2


def test_an_exception_leaving_the_with_block_is_not_held_back_by_a_full_queue():
    """Leaving ``with adder:`` because of an exception hands nothing more over: the
    exception comes out at once, not the full queue's timeout, and the writer is released."""
    replay, queue = tables(1)
    adder = NStepTransitionAdder(
        [replay, queue], n=2, discount=0.9, num_envs=None, chunk_length=1, timeout=30.0,
        tables=[replay], sequence_tables={queue: SequenceItems(3, 3)}, hand_over_every=50,
    )
    with pytest.raises(ValueError, match="the user's own error"), adder:
        adder.reset(np.zeros(3, np.float32))
        for t in range(1, 12):  # staged: several queue items for a queue of one
            adder.add(t, 1.0, np.full(3, t, np.float32), False, False)
        assert queue.size == 0
        raise ValueError("the user's own error")
    assert replay.store.overwrite.retentions() == []  # the writer let its steps go
    with pytest.raises(ClosedError):
        adder.add(5, 1.0, np.full(3, 5, np.float32), False, False)
    adder.close()  # closed already: nothing to do
