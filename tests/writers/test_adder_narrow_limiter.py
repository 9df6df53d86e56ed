"""An adder over a table whose rate limiter admits only a few items at once hands its
items over in packs that limiter can admit: with a learner sampling alongside, every item
arrives (acting and learning alternate), in the order of the steps, where a chunk of more
items than the limiter ever admits at once was refused with DeadlockError."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from rlreplay import Fifo, MinSize, NStepTransitionAdder, Queue, SampleToInsertRatio, Table
from rlreplay.core.rate_limiters import RateLimiter
from rlreplay.errors import ReplayTimeoutError

SIG = NStepTransitionAdder.signature(obs=((1,), "float32"), action="int64")
NUM_ENVS = 16
STEPS = 40

LIMITERS = {
    # diff between 5 and 15: 6 items admitted at once from 9 held (no sample possible
    # below 10), 10 once sampling runs; an adder chunk holds up to 64 per environment
    "ratio_1_min_10_buffer_5": lambda: SampleToInsertRatio(1.0, 10, 5.0),
    "queue_of_4": lambda: Queue(4),
    "unlimited": lambda: None,
}


def table_with(limiter: RateLimiter | None) -> Table:
    """A queue-like table (each item sampled once, oldest first) over n-step rows."""
    return Table(
        "replay",
        signature=SIG,
        capacity=4096,
        max_size=4096,
        layout=NStepTransitionAdder.layout(SIG, 3),
        sampler=Fifo(),
        max_times_sampled=1,
        rate_limiter=limiter,
    )


def act(adder: NStepTransitionAdder) -> None:
    """STEPS vector steps of NUM_ENVS environments; env i's action at step t is
    ``t * NUM_ENVS + i`` and its episodes end every ``7 + i % 5`` steps."""
    adder.reset(np.zeros((NUM_ENVS, 1), np.float32))
    envs = np.arange(NUM_ENVS)
    for t in range(STEPS):
        done = (t + 1) % (7 + envs % 5) == 0
        obs = np.full((NUM_ENVS, 1), t + 1, np.float32)
        adder.add(t * NUM_ENVS + envs, np.ones(NUM_ENVS), obs, done, np.zeros(NUM_ENVS, bool))
    adder.close()


def sample_all(table: Table) -> list[int]:
    """Every item's action, oldest first (the table never blocks a sample)."""
    return [int(table.sample(1).data["action"][0]) for _ in range(table.size)]


def consume(table: Table, taken: list[int], stop: threading.Event) -> None:
    """The learner: one item at a time until ``stop`` (bounded by a deadline)."""
    deadline = time.monotonic() + 60.0
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            taken.append(int(table.sample(1, timeout=0.05).data["action"][0]))
        except ReplayTimeoutError:
            continue


@pytest.mark.parametrize("name", list(LIMITERS))
def test_an_adder_over_a_narrow_limiter_hands_over_every_item_in_order(name):
    unlimited = table_with(None)
    act(NStepTransitionAdder(unlimited, n=3, discount=0.9, num_envs=NUM_ENVS))
    want = sample_all(unlimited)
    assert len(want) > 500

    table = table_with(LIMITERS[name]())
    taken: list[int] = []
    stop = threading.Event()
    learner = threading.Thread(target=consume, args=(table, taken, stop), daemon=True)
    learner.start()
    started = time.monotonic()
    try:
        act(NStepTransitionAdder(table, n=3, discount=0.9, num_envs=NUM_ENVS, timeout=20.0))
        while table.can_sample(1) and time.monotonic() - started < 30.0:
            time.sleep(0.01)  # the learner takes what the limiter lets through
    finally:
        stop.set()
        learner.join(5.0)
    assert not learner.is_alive()
    assert time.monotonic() - started < 30.0
    # the learner took the oldest items; what the limiter holds back is still in the table
    assert table.rate_limiter.inserts == len(want)
    assert taken == want[: len(taken)]
    assert len(taken) + table.size == len(want)
    assert len(taken) >= len(want) - 15


WINDOWS = {
    "ratio_while_filling": (lambda: SampleToInsertRatio(1.0, 10, 5.0), 6),
    "ratio_wide_buffer": (lambda: SampleToInsertRatio(1.0, 10, 50.0), 51),
    "ratio_of_4_filling": (lambda: SampleToInsertRatio(4.0, 100, 40.0), 11),
    "queue_of_4": (lambda: Queue(4), 4),
    "min_size": (lambda: MinSize(10), math.inf),
}


@pytest.mark.parametrize("name", list(WINDOWS))
def test_the_insert_window_is_admitted_from_every_state_a_writer_waits_in(name):
    make, window = WINDOWS[name]
    assert make().insert_window() == window
    if math.isinf(window):
        return
    limiter = make()
    limiter.check_insert_batch(window)
    # one item short of min_size_to_sample, where no sample can make room
    held = limiter.min_size_to_sample - 1
    limiter.inserts = held
    assert limiter.can_insert(window, held)
    # drained to min_diff by samples
    limiter.samples = int(limiter.inserts * limiter.samples_per_insert - limiter.min_diff)
    assert limiter.can_insert(window, limiter.min_size_to_sample + 1)
