"""Adders stage completed rows and hand them to the writer every ``hand_over_every`` calls:
items reach their tables within that bound (and at every flush, end_episode, reset and
close), the tables then hold exactly what they hold when every call hands over, and the
cheap checks and whole-vector writes behind the staging change nothing a caller sees."""

from __future__ import annotations

import numpy as np
import pytest
from counting_env import make_vec
from test_adder_batched_chunks import CountingWriter

from rlreplay import (
    Fifo,
    InvalidArgumentError,
    NStepTransitionAdder,
    SequenceAdder,
    SequenceItems,
    SignatureError,
    Table,
)

SIG = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")


def fifo_table(n: int = 2, stack: int = 1, sig=SIG) -> Table:
    return Table(
        "replay",
        signature=sig,
        capacity=8192,
        layout=NStepTransitionAdder.layout(sig, n, stack=stack),
        sampler=Fifo(),
        max_times_sampled=1,
    )


def test_items_reach_the_table_within_hand_over_every_calls_and_at_flush():
    table = fifo_table(n=1)
    adder = NStepTransitionAdder(table, n=1, discount=0.9, num_envs=2, hand_over_every=4)
    obs = np.zeros((2, 3), np.float32)
    adder.reset(obs)
    done = np.ones(2, bool)
    step = (np.ones(2, np.int64), np.ones(2), obs)
    adder.add(*step, done, ~done)  # both episodes end: their rows and items are staged
    assert (table.size, adder.staged_rows) == (0, 4)
    adder.add(*step, ~done, ~done)  # next-step envs reset
    adder.add(*step, ~done, ~done)
    assert (table.size, adder.staged_rows) == (0, 4)
    adder.add(*step, ~done, ~done)  # the fourth call hands the staged rows over
    assert (table.size, adder.staged_rows) == (2, 0)
    # Two steps into the new episodes: the first step's row is complete (the episode
    # went on past it), and flush hands it over; its item also reads the second step's
    # row, not complete yet (end_episode could still make its step the last).
    adder.flush()
    assert (table.size, adder.staged_rows, adder.appended_rows) == (2, 0, 6)
    adder.add(*step, ~done, ~done)
    assert (table.size, adder.staged_rows) == (2, 0)  # a chunk of 64 rows is not full
    adder.end_episode()  # as flush, reset and close: everything goes over
    assert (table.size, adder.staged_rows) == (2 + 2 * 3, 0)


def test_staged_rows_go_over_early_once_they_fill_every_times_num_envs_rows():
    table = fifo_table(n=1)
    adder = NStepTransitionAdder(table, n=1, discount=0.9, num_envs=2, hand_over_every=2)
    obs = np.zeros((2, 3), np.float32)
    adder.reset(obs)
    no = np.zeros(2, bool)
    step = (np.ones(2, np.int64), np.ones(2), obs)
    for _ in range(3):
        adder.add(*step, no, no)
    adder.add(*step, ~no, no)  # 2 envs x 5 rows staged: past 2 x 2, handed over at once
    assert table.size == 8 and adder.staged_rows == 0


@pytest.mark.parametrize(
    "num_envs, every", [pytest.param(None, 1, id="one_env"), pytest.param(4, 16, id="batched")]
)
def test_hand_over_every_defaults_to_every_call_without_a_batch_axis(num_envs, every):
    adder = NStepTransitionAdder(fifo_table(), n=2, discount=0.9, num_envs=num_envs)
    assert adder._out.every == every


@pytest.mark.parametrize("every", [0, -1, 2.0, True, "4"])
def test_a_bad_hand_over_every_is_refused_naming_it(every):
    with pytest.raises(InvalidArgumentError, match="hand_over_every"):
        NStepTransitionAdder(fifo_table(), n=2, discount=0.9, num_envs=2, hand_over_every=every)


def play(every, mode, stack, seed, steps=120, num_envs=3):
    """Items of an n-step table and a FIFO queue of sequences over one store, in the
    order each table holds them, after CountingEnv steps with resets and flushes."""
    envs, obs = make_vec(num_envs, mode, seed=seed, max_len=7)
    replay = fifo_table(n=2, stack=stack)
    queue = Table.queue(
        "queue", 4096, store=replay.store, layout=SequenceAdder.layout(SIG, 3, pad_end=True)
    )
    adder = NStepTransitionAdder(
        [replay, queue],
        n=2,
        discount=0.9,
        stack=stack,
        num_envs=num_envs,
        autoreset_mode=mode,
        chunk_length=4,
        tables=[replay],
        sequence_tables={queue: SequenceItems(3, 2)},
        hand_over_every=every,
    )
    adder.reset(obs)
    rng = np.random.default_rng(seed)
    for t in range(steps):
        action = rng.integers(5, size=num_envs)
        obs, reward, term, trunc, info = envs.step(action)
        adder.add(action, reward, obs, term, trunc, info)
        if t % 37 == 36:
            adder.flush()
        if t % 53 == 52:
            adder.end_episode(False, [0])
            adder.reset(obs[:1] + 100, [0])
    adder.close()
    envs.close()
    return [t.sample(t.size).data for t in (replay, queue)], adder


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
@pytest.mark.parametrize("stack", [1, 2])
@pytest.mark.parametrize("every", [2, 7, 16])
def test_staged_hand_over_stores_what_handing_over_every_call_stores(mode, stack, every):
    want, ref = play(1, mode, stack, seed=every)
    got, adder = play(every, mode, stack, seed=every)
    for data, expected in zip(got, want):
        assert data.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(data[key], expected[key], err_msg=key)
    counters = ("appended_rows", "copied_rows", "items_created", "episodes")
    assert [getattr(adder, c) for c in counters] == [getattr(ref, c) for c in counters]


def test_staged_pieces_go_over_in_one_append_and_one_insert_per_table():
    envs, obs = make_vec(4, "next_step", seed=3, max_len=5)
    table = fifo_table()
    writer = CountingWriter([table], history=512)
    adder = NStepTransitionAdder(writer, n=2, discount=0.9, num_envs=4, hand_over_every=8)
    adder.reset(obs)
    rng = np.random.default_rng(3)
    for _ in range(40):
        writer.mark()
        action = rng.integers(5, size=4)
        obs, reward, term, trunc, info = envs.step(action)
        adder.add(action, reward, obs, term, trunc, info)
    envs.close()
    handed = [calls for calls in writer.calls if calls]
    assert len(handed) >= 3
    assert all(calls == {"append_batch": 1, "create_items replay": 1} for calls in handed)
    assert table.size > 3 * 8  # several episodes' items each time


def test_an_episode_ended_before_its_first_step_keeps_a_zero_final_row():
    """A next-step env's ignored step is written into its cleared rows with every env's
    step; an episode that ends before its first step must still store zeros there."""
    table = fifo_table(n=1)
    adder = NStepTransitionAdder(table, n=1, discount=0.9, num_envs=2)
    obs = np.zeros((2, 3), np.float32)
    adder.reset(obs)
    action, reward = np.array([7, 7]), np.array([5.0, 5.0])
    adder.add(action, reward, obs, np.array([True, False]), np.zeros(2, bool))
    first = np.array([[1, 1, 1], [2, 2, 2]], np.float32)
    adder.add(action, reward, first, np.zeros(2, bool), np.zeros(2, bool))  # env 0 resets
    adder.end_episode(False, [0])  # env 0's new episode ends with no step taken
    store = table.store
    last = store.read(np.array([store.next_id - 1]))
    assert last["obs"][0].tolist() == [1.0, 1.0, 1.0]  # env 0's reset observation
    assert (last["action"][0], last["reward"][0]) == (0, 0.0)


def test_a_dtype_admitted_once_still_has_narrowed_values_checked():
    sig = NStepTransitionAdder.signature(obs=((3,), "float32"), action="uint8")
    table = fifo_table(n=1, sig=sig)
    adder = NStepTransitionAdder(table, n=1, discount=0.9, num_envs=2)
    obs = np.zeros((2, 3), np.float32)
    adder.reset(obs)
    no = np.zeros(2, bool)
    adder.add(np.array([1, 2]), np.ones(2), obs, no, no)  # int64 in range: admitted
    with pytest.raises(SignatureError, match="action"):
        adder.add(np.array([300, 2]), np.ones(2), obs, no, no)
    with pytest.raises(SignatureError, match="shape"):
        adder.add(np.array([1, 2]), np.ones(2), np.zeros((2, 4), np.float32), no, no)
    with pytest.raises(SignatureError, match="action"):
        adder.add(np.array([1.5, 2.0]), np.ones(2), obs, no, no)
    assert adder._steps.tolist() == [1, 1]  # the refused calls changed nothing
    adder.add(np.array([3, 4], np.uint8), np.ones(2, np.float32), obs, ~no, no)
    adder.flush()
    assert sorted(table.sample(table.size).data["action"].tolist()) == [1, 2, 3, 4]


def test_many_batched_adders_over_one_store_keep_room_for_each_other():
    """Each adder's writer keeps the staged rows' history only as far as a small share of
    the store allows: twelve actors' adders over one store all keep writing."""
    replay = Table(
        "replay",
        signature=SIG,
        capacity=2048,
        layout=NStepTransitionAdder.layout(SIG, 3),
    )
    adders, envs = [], []
    for k in range(12):
        env, first = make_vec(16, "next_step", seed=k, max_len=6)
        adder = NStepTransitionAdder(replay, n=3, discount=0.9, num_envs=16)
        adder.reset(first)
        adders.append(adder)
        envs.append(env)
    rng = np.random.default_rng(0)
    for _ in range(40):
        for adder, env in zip(adders, envs):
            action = rng.integers(5, size=16)
            next_obs, reward, term, trunc, info = env.step(action)
            adder.add(action, reward, next_obs, term, trunc, info)
    for adder, env in zip(adders, envs):
        adder.close()
        env.close()
    assert replay.size > 0 and sum(a.items_created for a in adders) > 12 * 40
