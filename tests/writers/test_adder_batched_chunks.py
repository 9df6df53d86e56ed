"""One adder call hands everything it completed, for every environment, to the writer as
one chunk (one ``append_batch``, one ``create_items`` per table), and the store then holds
exactly the rows and items it holds when each environment's rows go over as their own
chunk: same data, same episode boundaries, same order per table, also when the writer
times out."""

from __future__ import annotations

import random

import numpy as np
from counting_env import make_vec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_adder_timeouts import drain

from rlreplay import (
    Fifo,
    NStepTransitionAdder,
    ReplayTimeoutError,
    SequenceAdder,
    SequenceItems,
    Table,
    TrajectoryWriter,
)
from rlreplay.net import Client, Server

SIG = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")


class CountingWriter(TrajectoryWriter):
    """A local writer that counts its calls per adder call (``marks`` starts a new count)."""

    def __init__(self, tables, history):
        super().__init__(tables, history=history)
        self.calls: list[dict] = []

    def mark(self) -> None:
        self.calls.append({})

    def _count(self, name: str) -> None:
        self.calls[-1][name] = self.calls[-1].get(name, 0) + 1

    def append_batch(self, steps, *, timeout=None):
        self._count("append_batch")
        return super().append_batch(steps, timeout=timeout)

    def create_items(self, table, priorities=None, *, starts, lengths=None, timeout=None):
        self._count(f"create_items {getattr(table, 'name', table)}")
        return super().create_items(
            table, priorities, starts=starts, lengths=lengths, timeout=timeout
        )


def make_tables(queue_size: int = 4096, stack: int = 1, n: int = 2) -> tuple[Table, Table]:
    """An n-step table and a FIFO queue of sequences over its store, both read oldest
    first and once."""
    sig = SIG
    replay = Table(
        "replay",
        signature=sig,
        capacity=8192,
        layout=NStepTransitionAdder.layout(sig, n, stack=stack),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    queue = Table.queue(
        "queue", queue_size, store=replay.store, layout=SequenceAdder.layout(sig, 3, pad_end=True)
    )
    return replay, queue


def one_chunk_per_env(adder: NStepTransitionAdder) -> None:
    """Make ``adder`` hand each environment's rows over as a chunk of their own (the
    reference the joined chunks must match)."""
    batch = adder._out.batch
    add = batch.add

    def add_alone(*args):
        add(*args)
        batch._close()

    batch.add = add_alone


def test_one_add_makes_one_append_and_one_create_items_per_table_for_all_envs():
    envs, obs = make_vec(4, "next_step", seed=5, max_len=8)
    replay, queue = make_tables()
    writer = CountingWriter([replay, queue], history=128)
    adder = NStepTransitionAdder(
        writer,
        n=2,
        discount=0.9,
        num_envs=4,
        chunk_length=64,
        tables=[replay],
        sequence_tables={queue: SequenceItems(3, 2)},
        hand_over_every=1,
    )
    adder.reset(obs)
    rng = np.random.default_rng(5)
    several_ended = 0
    for _ in range(200):
        action = rng.integers(5, size=4)
        obs, reward, term, trunc, info = envs.step(action)
        writer.mark()
        adder.add(action, reward, obs, term, trunc, info)
        several_ended += int(np.count_nonzero(term | trunc) >= 2)
        assert all(count == 1 for count in writer.calls[-1].values()), writer.calls[-1]
    envs.close()
    assert several_ended > 10, "episodes of several envs must end in one add"
    writer.mark()
    adder.end_episode()  # every env's last rows in one chunk as well
    assert writer.calls[-1] == {
        "append_batch": 1,
        "create_items replay": 1,
        "create_items queue": 1,
    }


def play(
    num_envs,
    mode,
    seed,
    n,
    stack,
    chunk,
    max_len,
    ops,
    joined,
    queue_size=4096,
    consume=None,
    remote=False,
):
    """Feed CountingEnv steps and random flush/end_episode/reset calls (``ops[t]``: 0 a
    step only, 1 then flush, 2 then end_episode and reset of env 0, 3 then reset of env 0
    (its open episode ends as truncated)) to an
    adder over an n-step table and a queue of sequences; ``consume(t)``: take the queue's
    items after step ``t``; ``remote``: through a server's remote writer. Returns the
    items of both tables, oldest first, the adder, and the timeouts met."""
    replay, queue = make_tables(queue_size, stack, n)
    if not remote:
        return _play(
            TrajectoryWriter([replay, queue], history=256),
            replay,
            queue,
            0.003,
            num_envs,
            mode,
            seed,
            n,
            stack,
            chunk,
            max_len,
            ops,
            joined,
            consume,
        )
    server = Server([replay, queue], recheck_s=0.01).start()
    try:
        writer = Client(server.address).trajectory_writer(
            ["replay", "queue"], history=256, chunk_steps=16, max_in_flight=1, timeout=0.05
        )
        with writer:
            return _play(
                writer,
                replay,
                queue,
                0.02,
                num_envs,
                mode,
                seed,
                n,
                stack,
                chunk,
                max_len,
                ops,
                joined,
                consume,
            )
    finally:
        server.stop()


def _play(
    writer,
    replay,
    queue,
    timeout,
    num_envs,
    mode,
    seed,
    n,
    stack,
    chunk,
    max_len,
    ops,
    joined,
    consume,
):
    envs, obs = make_vec(num_envs, mode, seed=seed, max_len=max_len)
    adder = NStepTransitionAdder(
        writer,
        n=n,
        discount=0.9,
        stack=stack,
        num_envs=num_envs,
        autoreset_mode=mode,
        chunk_length=chunk,
        timeout=timeout,
        tables=["replay"],
        sequence_tables={"queue": SequenceItems(3, 2)},
    )
    if not joined:
        one_chunk_per_env(adder)
    rng = np.random.default_rng(seed)
    taken: list = []
    timeouts = 0

    def call(f, *args):
        nonlocal timeouts
        try:
            f(*args)
        except ReplayTimeoutError:
            timeouts += 1

    call(adder.reset, obs)
    for t, op in enumerate(ops):
        action = rng.integers(5, size=num_envs)
        obs, reward, term, trunc, info = envs.step(action)
        call(adder.add, action, reward, obs, term, trunc, info)
        if op == 1:
            call(adder.flush)
        elif op >= 2:
            if op == 2:
                call(adder.end_episode, False, [0])
            call(adder.reset, obs[:1] + 100, [0])  # a new episode of env 0 from here
        if consume is not None and consume(t):
            drain(queue, taken)
    for _ in range(200):  # close: hand over what is left, making room as needed
        try:
            adder.close()
            break
        except ReplayTimeoutError:
            timeouts += 1
            drain(queue, taken)
    drain(queue, taken)
    envs.close()
    assert adder.pending_chunks == 0
    data = replay.sample(replay.size).data if replay.size else {}
    return data, taken, adder, timeouts


def assert_same(a, b) -> None:
    data, taken, adder, _ = a
    want, want_taken, ref, _ = b
    assert data.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(data[key], want[key], err_msg=key)
    assert len(taken) == len(want_taken)
    for (obs, action), (want_obs, want_action) in zip(taken, want_taken):
        np.testing.assert_array_equal(obs, want_obs)
        np.testing.assert_array_equal(action, want_action)
    counters = ("appended_rows", "copied_rows", "items_created", "episodes")
    assert [getattr(adder, c) for c in counters] == [getattr(ref, c) for c in counters]


CASES = dict(
    num_envs=st.integers(1, 6),
    mode=st.sampled_from(["next_step", "same_step"]),
    seed=st.integers(0, 10_000),
    n=st.integers(1, 3),
    stack=st.integers(1, 2),
    chunk=st.integers(1, 8),
    max_len=st.integers(1, 12),
    ops=st.lists(st.sampled_from([0, 0, 0, 0, 1, 2, 3]), min_size=40, max_size=40),
)


@settings(max_examples=40, deadline=None)
@given(**CASES)
def test_joined_chunks_store_the_items_of_one_chunk_per_env(
    num_envs, mode, seed, n, stack, chunk, max_len, ops
):
    args = (num_envs, mode, seed, n, stack, chunk, max_len, ops)
    joined = play(*args, joined=True)
    assert_same(joined, play(*args, joined=False))
    assert len(joined[0]["obs"]) > 0


@settings(max_examples=20, deadline=None)
@given(
    **CASES,
    queue_size=st.integers(6, 12),
    schedule=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_joined_chunks_under_writer_timeouts_store_the_items_of_a_writer_that_never_waits(
    num_envs, mode, seed, n, stack, chunk, max_len, ops, queue_size, schedule
):
    args = (num_envs, mode, seed, n, stack, chunk, max_len, ops)
    expected = play(*args, joined=False)
    assert expected[3] == 0
    blocked = play(*args, joined=True, queue_size=queue_size, consume=lambda t: schedule[t])
    assert_same(blocked, expected)


def test_a_queue_smaller_than_the_joined_items_gets_them_in_calls_it_can_admit():
    """The joined items of one call are split into calls of at most the table's max_size
    (each call admits only what the queue can ever hold)."""
    args = (6, "next_step", 3, 2, 1, 8, 3, [0] * 40)
    expected = play(*args, joined=False)
    blocked = play(*args, joined=True, queue_size=3, consume=lambda t: True)
    assert blocked[3] > 0, "the queue must have blocked the adder"
    assert_same(blocked, expected)


def remote_case(num_envs, mode, seed, n, stack, chunk, max_len, ops, period) -> int:
    """Joined chunks through a remote writer whose queue (``max_size`` 32) is drained
    every ``period`` steps store the items of one chunk per env through a local writer
    that never waits. Returns the timeouts met."""
    args = (num_envs, mode, seed, n, stack, chunk, max_len, ops)
    expected = play(*args, joined=False)
    consume = lambda t: t % period == period - 1  # noqa: E731
    blocked = play(*args, joined=True, queue_size=32, consume=consume, remote=True)
    assert_same(blocked, expected)
    return blocked[3]


@settings(max_examples=6, deadline=None)
@given(**CASES, period=st.integers(10, 40))
def test_joined_chunks_through_a_remote_writer_that_times_out_store_the_items_of_one_chunk_per_env(
    num_envs, mode, seed, n, stack, chunk, max_len, ops, period
):
    remote_case(num_envs, mode, seed, n, stack, chunk, max_len, ops, period)


def test_a_remote_writer_joining_more_items_than_the_queue_holds_sends_them_in_chunks():
    """Five envs of one-step episodes join 40 or more items within a hand-over: the remote
    writer cuts its chunks at the queue's max_size (the server refuses a larger chunk)."""
    rnd = random.Random(4)
    ops = [rnd.choice([0, 0, 0, 0, 1, 2, 3]) for _ in range(40)]
    remote_case(5, "same_step", 4, 1, 1, 1, 1, ops, period=10)


def test_a_remote_writer_that_times_out_gets_the_items_of_joined_chunks_once():
    timeouts = remote_case(4, "next_step", 3, 2, 1, 8, 5, [0] * 40, period=25)
    assert timeouts > 0, "the queue must have blocked the adder"
