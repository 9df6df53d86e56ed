"""The overwrite protocol's invariant under real threads: several writers, several tables
(evict / block / relocate) over one store, a sampler, and checks while they run.

Every step carries ``(writer, episode, index)``; every sampled window must hold
consecutive steps of one writer's one episode (no item is served with a step it did not
anchor), and whenever the lock is free each table's size, live flags and selectors agree.
Every wait has a timeout and every thread is joined with one, so a deadlock fails the
test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from overwrite_checks import assert_consistent, check_window, make_tables

from rlreplay import StepStore, Table, TrajectoryWriter
from rlreplay.errors import ReplayTimeoutError

SIGNATURE = {"w": "int64", "e": "int64", "i": "int64"}
STEPS_PER_WRITER = 150
JOIN_S = 20.0


def writer_loop(writer: TrajectoryWriter, w: int, span: int, seed: int, errors: list) -> None:
    rng = np.random.default_rng(seed)
    episode, in_episode = 0, 0
    try:
        for i in range(STEPS_PER_WRITER):
            step = {"w": np.int64(w), "e": np.int64(episode), "i": np.int64(i)}
            try:
                writer.append(step, timeout=0.1)
            except ReplayTimeoutError:
                writer.end_episode()  # the step may be missing: start afresh
                episode, in_episode = episode + 1, 0
                continue
            in_episode += 1
            if in_episode >= span:
                table = writer.tables[int(rng.integers(len(writer.tables)))]
                with contextlib.suppress(ReplayTimeoutError):
                    writer.create_item(table, timeout=0.05)
            if rng.random() < 0.08:
                writer.end_episode()
                episode, in_episode = episode + 1, 0
    except BaseException as exc:  # handed to the test thread
        errors.append(exc)


def sampler_loop(tables: list[Table], span: int, done: threading.Event, errors: list) -> None:
    deadline = time.monotonic() + JOIN_S
    try:
        while not done.is_set() and time.monotonic() < deadline:
            for t in tables:
                n = 2 if t.can_sample(2) else 1
                if t.can_sample(n):
                    with contextlib.suppress(ReplayTimeoutError):
                        check_window(t.sample(n, timeout=0.05).data, span)
            with tables[0].mutex:
                assert_consistent(tables)
            time.sleep(0.0005)
    except BaseException as exc:  # handed to the test thread
        errors.append(exc)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    writers=st.integers(1, 3),
    policies=st.lists(st.sampled_from(["evict", "block", "relocate"]), min_size=1, max_size=3),
    span=st.integers(1, 3),
    slack=st.integers(0, 12),
    seed=st.integers(0, 2**16),
)
def test_no_item_is_served_with_a_step_it_did_not_anchor_under_threads(
    writers, policies, span, slack, seed
):
    history = span + 1
    held = 3 * span * sum(p != "evict" for p in policies)  # queues and stacks keep 3 each
    store = StepStore(SIGNATURE, capacity=writers * history + held + span + 1 + slack)
    tables = make_tables(store, policies, span, size=3)
    errors: list = []
    done = threading.Event()
    sampler = threading.Thread(target=sampler_loop, args=(tables, span, done, errors), daemon=True)
    threads = [
        threading.Thread(
            target=writer_loop,
            args=(TrajectoryWriter(tables, history=history), w, span, seed + w, errors),
            daemon=True,
        )
        for w in range(writers)
    ]
    sampler.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    done.set()
    sampler.join(JOIN_S)
    assert not any(t.is_alive() for t in [*threads, sampler]), "a thread did not finish"
    assert not errors, errors
    assert_consistent(tables)
    for t in tables:  # what is left is sound as well (queues and stacks drain)
        for _ in range(8):
            if t.can_sample(1):
                check_window(t.sample(1, timeout=0.05).data, span)
        assert_consistent([t])
