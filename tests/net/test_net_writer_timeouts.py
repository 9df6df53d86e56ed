"""A remote writer under rate-limiter backpressure stores exactly what an in-process writer
stores: a chunk sent because it holds as many items as a limiter admits at once, an episode
that ends right after it, and writer calls that time out lose and repeat nothing."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter

import numpy as np
import pytest
from counting_env import make_vec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlreplay import (
    Fifo,
    ItemLayout,
    NStepTransitionAdder,
    RateLimiterTimeoutError,
    ReplayTimeoutError,
    SampleToInsertRatio,
    Table,
    TrajectoryWriter,
)
from rlreplay.net import Client, Server

ROWS_SIG = {"obs": ((2,), "float32")}


def limited_rows_table() -> Table:
    """One-step items; the limiter admits 6 items at once (its insert window: writers send
    chunks of half, 3 items) and 12 before any sample."""
    return Table(
        "rows",
        signature=ROWS_SIG,
        layout=ItemLayout.rows(ROWS_SIG),
        capacity=64,
        max_size=64,
        sampler=Fifo(),
        rate_limiter=SampleToInsertRatio(1.0, min_size_to_sample=7, error_buffer=5.0),
    )


def wait_for(condition, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out waiting for the server"
        time.sleep(0.005)


def stored_obs(table: Table) -> list[float]:
    rows = np.flatnonzero(table.index.live)
    return sorted(table.store.columns["obs"][rows, 0].tolist())


@pytest.mark.parametrize("interleaved", [False, True], ids=["alone", "another_writer_between"])
def test_items_of_an_episode_sent_after_its_steps_survive_an_episode_end_at_a_chunk_start(
    interleaved,
):
    """The 4th item of an episode goes in the chunk after the one its window filled; when
    the episode ends before the next step, that chunk begins a new episode at its first
    step and still carries the item over the previous episode's steps (which stay where
    the item reads them also when another writer appended in between)."""
    table = limited_rows_table()
    server = Server([table]).start()
    try:
        client = Client(server.address)
        assert client.describe("rows")["insert_window"] == 6  # chunks hold half: 3
        with client.trajectory_writer("rows", history=8, chunk_steps=32) as writer:
            for k in range(4):
                writer.append({"obs": np.array([k, 0], np.float32)})
            for start in (-4, -3, -2, -1):  # a chunk's 3 items: it goes out
                writer.create_item("rows", start=start)
            writer.end_episode()
            if interleaved:  # the first chunk is stored, then another stream's steps
                wait_for(lambda: table.size == 3)
                with client.trajectory_writer("rows") as other:
                    other.append_batch({"obs": np.full((5, 2), -1, np.float32)})
            for k in (10, 11):
                writer.append({"obs": np.array([k, 0], np.float32)})
                writer.create_item("rows")
            writer.flush(timeout=5.0)
        assert stored_obs(table) == [0, 1, 2, 3, 10, 11]
    finally:
        server.stop()


def retried(call, table: Table, tries: int = 200):
    """``call()`` again after each timeout, once the learner sampled what its limiter
    lets it (at most ``tries`` times)."""
    for _ in range(tries):
        try:
            return call()
        except ReplayTimeoutError:
            while table.can_sample(2):
                table.sample(2)
    pytest.fail(f"still timing out after {tries} tries")


def test_a_writer_call_that_times_out_takes_nothing_and_its_repeat_stores_each_step_once():
    """While a chunk waits for the learner, ``append_batch`` and ``create_items`` that must
    hand queued chunks over first raise and take nothing (neither steps nor items);
    repeated after the learner sampled, every step and item is stored once."""
    table = limited_rows_table()
    server = Server([table], recheck_s=0.01).start()
    try:
        client = Client(server.address)
        with client.trajectory_writer(
            "rows", history=32, chunk_steps=4, max_in_flight=1, timeout=0.05
        ) as writer:

            def steps(first: int, n: int) -> dict:
                k = np.arange(first, first + n, dtype=np.float32)
                return {"obs": np.stack([k, k], axis=1)}

            assert writer.append_batch(steps(0, 18)) == 0
            for first in range(0, 15, 3):  # 15 items, 3 a chunk; the limiter admits 12
                writer.create_items("rows", starts=np.arange(first, first + 3) - 18)
            with pytest.raises(ReplayTimeoutError):
                writer.flush(timeout=0.05)
            # The waiting chunk goes again first; nothing more is due, so these return.
            writer.create_items("rows", starts=[-3, -2, -1])
            assert writer.append_batch(steps(18, 9)) == 18  # queues two chunks
            with pytest.raises(ReplayTimeoutError):
                writer.create_items("rows", starts=np.arange(-9, 0))
            with pytest.raises(ReplayTimeoutError):
                writer.append_batch(steps(27, 9))
            retried(lambda: writer.create_items("rows", starts=np.arange(-9, 0)), table)
            assert retried(lambda: writer.append_batch(steps(27, 9)), table) == 27
            retried(lambda: writer.create_items("rows", starts=np.arange(-9, 0)), table)
            retried(lambda: writer.flush(timeout=0.05), table)
        assert stored_obs(table) == list(range(36))
    finally:
        server.stop()


# ------------------------------------------------------------- an adder over the wire
NSTEP_SIG = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")
NSTEP_LAYOUT = NStepTransitionAdder.layout(NSTEP_SIG, n=3)
NUM_ENVS = 4


def nstep_tables(limited: bool) -> tuple[Table, Table]:
    """The replay table (with a ratio limiter whose insert window is 5 items when
    ``limited``) and a FIFO mirror over its store that gets the same items, read whole
    at the end."""
    limiter = SampleToInsertRatio(1.0, min_size_to_sample=10, error_buffer=4.0)
    replay = Table(
        "replay",
        signature=NSTEP_SIG,
        layout=NSTEP_LAYOUT,
        capacity=4096,
        max_size=4096,
        **({"rate_limiter": limiter} if limited else {}),
    )
    mirror = Table(
        "mirror",
        store=replay.store,
        layout=NSTEP_LAYOUT,
        max_size=4096,
        sampler=Fifo(),
        max_times_sampled=1,
    )
    return replay, mirror


def env_calls(seed: int, steps: int) -> tuple[np.ndarray, list[tuple]]:
    """First observations and ``steps`` seeded ``add`` arguments (CountingEnv: every
    observation is distinct, so every item is)."""
    envs, first = make_vec(NUM_ENVS, "next_step", seed, max_len=12)
    rng = np.random.default_rng(seed)
    calls = []
    for _ in range(steps):
        action = rng.integers(5, size=NUM_ENVS)
        obs, reward, terminated, truncated, info = envs.step(action)
        calls.append((action, reward, obs, terminated, truncated, info))
    envs.close()
    return first, calls


def held_items(replay: Table, mirror: Table) -> Counter:
    """The items ``replay`` holds, as a multiset of their fields' bytes (read from the
    mirror, which holds items at the same anchors)."""
    np.testing.assert_array_equal(replay.index.live, mirror.index.live)
    n = mirror.size
    data = mirror.sample(n).data if n else {}
    return Counter(tuple(data[k][i].tobytes() for k in sorted(data)) for i in range(n))


def in_process_items(seed: int, steps: int) -> tuple[Counter, int]:
    replay, mirror = nstep_tables(limited=False)
    first, calls = env_calls(seed, steps)
    adder = NStepTransitionAdder([replay, mirror], n=3, discount=0.9, num_envs=NUM_ENVS)
    adder.reset(first)
    for call in calls:
        adder.add(*call)
    adder.close()
    return held_items(replay, mirror), adder.items_created


def remote_items(
    replay: Table, mirror: Table, seed: int, steps: int, after_step, make_room
) -> tuple[Counter, int, int]:
    """The same steps through a remote writer over ``replay`` (limited) and ``mirror``,
    with 10 ms adder calls (50 ms for the writer's own); ``after_step(t)`` runs after
    step ``t`` and ``make_room()`` after each failed close. Returns the items, the items
    the adder created and the timeouts it met."""
    first, calls = env_calls(seed, steps)
    server = Server([replay, mirror], recheck_s=0.01).start()
    timeouts = 0
    try:
        client = Client(server.address)
        with client.trajectory_writer(
            ["replay", "mirror"], history=128, chunk_steps=16, max_in_flight=1, timeout=0.05
        ) as writer:
            adder = NStepTransitionAdder(writer, n=3, discount=0.9, num_envs=NUM_ENVS, timeout=0.01)
            adder.reset(first)
            for t, call in enumerate(calls):
                try:
                    adder.add(*call)
                except ReplayTimeoutError:
                    timeouts += 1
                after_step(t)
            for _ in range(500):  # bounded: room is made between attempts
                try:
                    adder.close()
                    break
                except ReplayTimeoutError:
                    timeouts += 1
                    make_room()
            assert adder.pending_chunks == 0 and writer.pending_chunks == 0
        return held_items(replay, mirror), adder.items_created, timeouts
    finally:
        server.stop()


def sample_what_the_limiter_allows(replay: Table) -> None:
    while replay.can_sample(2):
        replay.sample(2)


def test_an_adder_over_a_remote_writer_with_a_sampling_learner_stores_what_in_process_does():
    """A learner thread samples, pausing for 12 of every 30 steps so that the limiter
    blocks inserts and the adder's calls time out; every item is stored once, exactly
    the items of the same steps through an in-process table without a limiter."""
    expected, created = in_process_items(seed=3, steps=90)
    replay, mirror = nstep_tables(limited=True)
    sampling, stop = threading.Event(), threading.Event()

    def learner() -> None:
        while not stop.is_set():
            if sampling.wait(0.005):
                sample_what_the_limiter_allows(replay)
                time.sleep(0.002)

    def after_step(t: int) -> None:
        if t % 30 < 12:
            sampling.clear()
        else:
            sampling.set()

    thread = threading.Thread(target=learner, daemon=True)
    thread.start()
    try:
        got, got_created, timeouts = remote_items(
            replay, mirror, 3, 90, after_step, lambda: sampling.set() or time.sleep(0.005)
        )
    finally:
        stop.set()
        thread.join(5.0)
    assert timeouts > 0, "the limiter must have blocked the adder"
    assert got_created == created
    assert got == expected and sum(got.values()) == created // 2


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 50), schedule=st.lists(st.booleans(), min_size=40, max_size=40))
def test_wherever_timeouts_fall_the_remote_adder_stores_what_in_process_does(seed, schedule):
    """The learner samples (in the actor's thread) only after the steps ``schedule``
    picks, so the limiter blocks, and the adder's calls time out, wherever it says."""
    expected, created = in_process_items(seed, steps=40)
    replay, mirror = nstep_tables(limited=True)

    def after_step(t: int) -> None:
        if schedule[t]:
            sample_what_the_limiter_allows(replay)

    got, got_created, _ = remote_items(
        replay, mirror, seed, 40, after_step, lambda: sample_what_the_limiter_allows(replay)
    )
    assert got_created == created
    assert got == expected


def test_an_adder_whose_step_timed_out_resumes_once_the_writer_takes_it_not_once_stored():
    """What an actor does after ``add`` timed out: ``hand_over()`` returns as soon as the
    writer has room for the kept chunk, while earlier chunks still wait for the learner
    (``flush()`` would wait until everything is stored, leaving the learner without the
    next chunk while the actor waits). Every item is still stored once."""
    replay, mirror = nstep_tables(limited=True)  # window 5: chunks of 2 items
    first, calls = env_calls(seed=5, steps=200)
    server = Server([replay, mirror], recheck_s=0.01).start()
    try:
        client = Client(server.address)
        with client.trajectory_writer(
            ["replay", "mirror"], history=128, chunk_steps=16, max_in_flight=2, timeout=0.05
        ) as writer:
            adder = NStepTransitionAdder(writer, n=3, discount=0.9, num_envs=NUM_ENVS, timeout=0.01)
            adder.reset(first)
            refused = None
            for t, call in enumerate(calls):
                try:
                    adder.add(*call)
                except ReplayTimeoutError:
                    refused = t
                    break
            assert refused is not None, "the limiter must have refused a step"
            with pytest.raises(ReplayTimeoutError):
                adder.hand_over(timeout=0.05)  # no room yet: still kept
            for _ in range(500):  # the learner makes room for one chunk of 2 at a time
                replay.sample(2)
                try:
                    adder.hand_over(timeout=0.05)
                    break
                except ReplayTimeoutError:
                    continue
            assert adder.pending_chunks == 0  # the writer took the kept step ...
            assert writer.pending_chunks >= 1  # ... while chunks still wait for room
            with pytest.raises(ReplayTimeoutError):
                adder.flush(timeout=0.05)  # flush waits for all of it to be stored
            for call in calls[refused + 1:refused + 4]:  # the actor acts on
                with contextlib.suppress(ReplayTimeoutError):
                    adder.add(*call)
            for _ in range(500):  # bounded: room is made between attempts
                try:
                    adder.close()
                    break
                except ReplayTimeoutError:
                    sample_what_the_limiter_allows(replay)
            assert adder.pending_chunks == 0 and writer.pending_chunks == 0
        assert replay.rate_limiter.inserts == adder.items_created // 2
    finally:
        server.stop()


def test_items_the_ratio_holds_back_in_process_time_out_blaming_the_learner_when_one_fits():
    table = limited_rows_table()
    writer = TrajectoryWriter(table, history=16)
    writer.append_batch({"obs": np.zeros((13, 2), np.float32)})
    writer.create_items(table, starts=np.arange(-13, -3))  # 10 items
    with pytest.raises(RateLimiterTimeoutError, match="learner") as caught:
        writer.create_items(table, starts=[-3, -2, -1], timeout=0.02)
    assert "queue" not in str(caught.value)
    assert table.size == 10


def test_a_chunk_the_ratio_holds_back_times_out_blaming_the_learner_even_when_one_item_fits():
    table = limited_rows_table()  # admits 12 items before any sample
    server = Server([table], recheck_s=0.01).start()
    try:
        client = Client(server.address)
        with client.trajectory_writer("rows", history=16, chunk_steps=16) as writer:
            writer.append_batch({"obs": np.zeros((13, 2), np.float32)})
            for first in (-13, -10, -7, -4):  # 3 + 3 + 3 + 1 = 10 items stored
                writer.create_items("rows", starts=np.arange(first, min(first + 3, -3)))
            writer.flush(timeout=5.0)
            writer.create_items("rows", starts=[-3, -2, -1])  # 13 > 12, though 11 fits
            with pytest.raises(ReplayTimeoutError, match="learner") as caught:
                writer.flush(timeout=0.05)
            assert "queue" not in str(caught.value)
            table.sample(2, timeout=5.0)
            writer.flush(timeout=5.0)
        assert table.size == 13
    finally:
        server.stop()
