"""Rate limiters: every rule at its boundaries, timeouts, real threads, deadlock rejection."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest
from conftest import Worker, rows
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay import (
    ClosedError,
    DeadlockError,
    InvalidArgumentError,
    MinSize,
    Queue,
    RateLimiter,
    RateLimiterTimeoutError,
    SampleToInsertRatio,
    Stack,
)
from rlreplay.core.rate_limiters import insert_pack

SHORT = 0.05  # seconds a call that must block is given before it times out


@dataclass
class Case:
    name: str
    limiter: object  # zero-argument factory of a RateLimiter
    setup: list  # ("insert", k) / ("sample", k) steps that must all be allowed
    op: str  # "insert" or "sample"
    n: int
    allowed: bool


def plain(spi, min_size, min_diff, max_diff):
    return lambda: RateLimiter(spi, min_size, min_diff, max_diff)


# RateLimiter(1, min_size_to_sample=3, min_diff=0, max_diff=2) unless said otherwise.
BASE = plain(1.0, 3, 0.0, 2.0)
RATIO = lambda: SampleToInsertRatio(2.0, 4, 3.0)  # noqa: E731  min_diff 5, max_diff 11

CASES = [
    # --- RateLimiter: inserts
    Case("insert up to min_size_to_sample ignores max_diff", BASE, [], "insert", 3, True),
    Case(
        "insert past min_size_to_sample blocked by max_diff",
        BASE,
        [("insert", 3)],
        "insert",
        1,
        False,
    ),
    Case(
        "insert crossing min_size_to_sample judged by max_diff",
        BASE,
        [("insert", 2)],
        "insert",
        2,
        False,
    ),
    Case(
        "insert reaching exactly max_diff allowed",
        BASE,
        [("insert", 3), ("sample", 2)],
        "insert",
        1,
        True,
    ),
    Case(
        "insert one past max_diff blocked", BASE, [("insert", 3), ("sample", 2)], "insert", 2, False
    ),
    # --- RateLimiter: samples
    Case("sample below min_size_to_sample blocked", BASE, [("insert", 2)], "sample", 1, False),
    Case("sample at min_size_to_sample allowed", BASE, [("insert", 3)], "sample", 1, True),
    Case(
        "sample down to exactly min_diff allowed",
        BASE,
        [("insert", 3), ("sample", 1)],
        "sample",
        2,
        True,
    ),
    Case("sample below min_diff blocked", BASE, [("insert", 3), ("sample", 2)], "sample", 2, False),
    # --- fractional samples_per_insert
    Case(
        "fractional spi: insert at max_diff allowed", plain(0.5, 1, 0.0, 1.0), [], "insert", 2, True
    ),
    Case(
        "fractional spi: insert past max_diff blocked",
        plain(0.5, 1, 0.0, 1.0),
        [("insert", 2)],
        "insert",
        1,
        False,
    ),
    Case(
        "fractional spi: sample to min_diff allowed",
        plain(0.5, 1, 0.0, 1.0),
        [("insert", 2)],
        "sample",
        1,
        True,
    ),
    Case(
        "fractional spi: sample past min_diff blocked",
        plain(0.5, 1, 0.0, 1.0),
        [("insert", 2), ("sample", 1)],
        "sample",
        1,
        False,
    ),
    # --- MinSize
    Case(
        "MinSize: sample blocked one short", lambda: MinSize(3), [("insert", 2)], "sample", 1, False
    ),
    Case(
        "MinSize: sample allowed at min size",
        lambda: MinSize(3),
        [("insert", 3)],
        "sample",
        1,
        True,
    ),
    Case(
        "MinSize: samples never run out",
        lambda: MinSize(3),
        [("insert", 3), ("sample", 50)],
        "sample",
        50,
        True,
    ),
    Case(
        "MinSize: inserts never blocked", lambda: MinSize(3), [("insert", 60)], "insert", 40, True
    ),
    # --- SampleToInsertRatio(2, 4, 3): min_diff = 5, max_diff = 11
    Case("ratio: inserts up to min size always allowed", RATIO, [], "insert", 4, True),
    Case("ratio: insert up to max_diff allowed", RATIO, [("insert", 4)], "insert", 1, True),
    Case("ratio: insert past max_diff blocked", RATIO, [("insert", 5)], "insert", 1, False),
    Case(
        "ratio: insert allowed again after a sample",
        RATIO,
        [("insert", 5), ("sample", 1)],
        "insert",
        1,
        True,
    ),
    Case("ratio: sample below min size blocked", RATIO, [("insert", 3)], "sample", 1, False),
    Case("ratio: sample down to min_diff allowed", RATIO, [("insert", 4)], "sample", 3, True),
    Case(
        "ratio: sample past min_diff blocked",
        RATIO,
        [("insert", 4), ("sample", 3)],
        "sample",
        1,
        False,
    ),
    # --- Queue(2) and Stack(2)
    Case("queue: fill to size allowed", lambda: Queue(2), [], "insert", 2, True),
    Case("queue: insert when full blocked", lambda: Queue(2), [("insert", 2)], "insert", 1, False),
    Case(
        "queue: insert allowed after one sample",
        lambda: Queue(2),
        [("insert", 2), ("sample", 1)],
        "insert",
        1,
        True,
    ),
    Case(
        "queue: sample of waiting items allowed",
        lambda: Queue(2),
        [("insert", 2)],
        "sample",
        2,
        True,
    ),
    Case(
        "queue: sample when none waits blocked",
        lambda: Queue(2),
        [("insert", 2), ("sample", 2)],
        "sample",
        1,
        False,
    ),
    Case("queue: sample on empty blocked", lambda: Queue(2), [], "sample", 1, False),
    Case("stack: insert when full blocked", lambda: Stack(2), [("insert", 2)], "insert", 1, False),
    Case(
        "stack: sample when none waits blocked",
        lambda: Stack(2),
        [("insert", 1), ("sample", 1)],
        "sample",
        1,
        False,
    ),
]


def drive(table, ops, next_id=0, timeout=1.0):
    for op, k in ops:
        if op == "insert":
            table.insert(rows(next_id, k), timeout=timeout)
            next_id += k
        else:
            table.sample(k, timeout=timeout)
    return next_id


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_limiter_rule_at_boundary(case, make_table):
    table = make_table(max_size=200, rate_limiter=case.limiter())
    next_id = drive(table, case.setup)
    limiter = table.rate_limiter
    check = table.can_insert if case.op == "insert" else table.can_sample
    assert check(case.n) is case.allowed
    rule = limiter.can_insert if case.op == "insert" else limiter.can_sample
    assert rule(case.n, table.size) is case.allowed

    before = table.info()
    if case.allowed:
        drive(table, [(case.op, case.n)], next_id, timeout=SHORT)
        after = table.info()
        counter = "inserts" if case.op == "insert" else "samples"
        assert getattr(after, counter) == getattr(before, counter) + case.n
    else:
        with pytest.raises(RateLimiterTimeoutError):
            drive(table, [(case.op, case.n)], next_id, timeout=SHORT)
        after = table.info()
        assert (after.size, after.inserts, after.samples) == (
            before.size,
            before.inserts,
            before.samples,
        )
        blocked = "insert_blocked_s" if case.op == "insert" else "sample_blocked_s"
        assert getattr(after, blocked) >= getattr(before, blocked) + SHORT * 0.9


def test_blocked_sample_is_released_by_an_insert_in_another_thread(make_table):
    table = make_table(max_size=10, rate_limiter=MinSize(2))
    table.insert(rows(0, 1))
    worker = Worker(lambda: table.sample(1, timeout=5.0))
    worker.start()
    worker.started_waiting.wait(2.0)
    time.sleep(0.2)
    assert worker.is_alive(), "sample should wait for the second item"
    table.insert(rows(1, 1))
    batch = worker.finish()
    assert len(batch) == 1 and batch.data["step"][0] in (0, 1)
    info = table.info()
    assert info.sample_blocked_s > 0.1 and info.samples == 1


def test_blocked_insert_is_released_by_a_sample_in_another_thread(make_table):
    table = make_table(max_size=10, rate_limiter=Queue(1))
    table.insert(rows(0, 1))
    worker = Worker(lambda: table.insert(rows(1, 1), timeout=5.0))
    worker.start()
    worker.started_waiting.wait(2.0)
    time.sleep(0.2)
    assert worker.is_alive(), "insert should wait until the waiting item is sampled"
    assert table.sample(1, timeout=1.0).data["step"].tolist() == [0]
    keys = worker.finish()
    assert len(keys) == 1
    info = table.info()
    assert info.insert_blocked_s > 0.1 and info.inserts == 2 and info.samples == 1


def test_several_blocked_samplers_are_all_released_by_enough_inserts(make_table):
    table = make_table(max_size=20, rate_limiter=Queue(10))
    workers = [Worker(lambda: table.sample(1, timeout=5.0)) for _ in range(3)]
    for w in workers:
        w.start()
    time.sleep(0.1)
    table.insert(rows(0, 3))
    got = sorted(int(w.finish().data["step"][0]) for w in workers)
    assert len(got) == 3 and table.info().samples == 3


@pytest.mark.parametrize("op", ["insert", "sample"])
def test_timeout_raises_after_waiting_and_counts_blocked_time(op, make_table):
    table = make_table(max_size=10, rate_limiter=Queue(1))
    if op == "insert":
        table.insert(rows(0, 1))
    start = time.monotonic()
    with pytest.raises(RateLimiterTimeoutError) as err:
        if op == "insert":
            table.insert(rows(1, 1), timeout=0.15)
        else:
            table.sample(1, timeout=0.15)
    assert time.monotonic() - start >= 0.15
    assert op in str(err.value)
    info = table.info()
    blocked = info.insert_blocked_s if op == "insert" else info.sample_blocked_s
    other = info.sample_blocked_s if op == "insert" else info.insert_blocked_s
    assert blocked >= 0.15 and other == 0.0
    assert isinstance(err.value, TimeoutError)


def test_calls_that_never_block_add_no_blocked_time(make_table):
    table = make_table(max_size=10, rate_limiter=MinSize(1))
    table.insert(rows(0, 5))
    table.sample(4)
    info = table.info()
    assert info.insert_blocked_s == 0.0 and info.sample_blocked_s == 0.0


def test_close_wakes_a_blocked_sample_with_closed_error(make_table):
    table = make_table(max_size=10)
    worker = Worker(lambda: table.sample(1, timeout=5.0))
    worker.start()
    time.sleep(0.1)
    table.close()
    with pytest.raises(ClosedError):
        worker.finish()


def test_reset_zeroes_the_limiter_counts_so_min_size_applies_again(make_table):
    table = make_table(max_size=10, rate_limiter=SampleToInsertRatio(1.0, 2, 2.0))
    table.insert(rows(0, 3))
    table.sample(1)
    table.reset()
    assert (table.rate_limiter.inserts, table.rate_limiter.samples) == (0, 0)
    assert not table.can_sample(1)
    assert table.can_insert(2)


DEADLOCKS = [
    ("gap below samples_per_insert", lambda: RateLimiter(2.0, 1, 0.0, 1.0), "max_diff"),
    ("ratio error_buffer too small", lambda: SampleToInsertRatio(4.0, 10, 1.0), "error_buffer"),
    ("ratio error_buffer zero", lambda: SampleToInsertRatio(1.0, 1, 0.0), "error_buffer"),
]


@pytest.mark.parametrize("factory,word", [c[1:] for c in DEADLOCKS], ids=[c[0] for c in DEADLOCKS])
def test_deadlocking_limiter_configurations_are_rejected(factory, word):
    with pytest.raises(DeadlockError) as err:
        factory()
    assert word in str(err.value)


def test_sample_batch_the_limiter_can_never_admit_is_rejected(make_table):
    table = make_table(max_size=10, rate_limiter=Queue(3))
    table.insert(rows(0, 3))
    with pytest.raises(DeadlockError, match="batch_size"):
        table.sample(4, timeout=SHORT)
    assert table.info().samples == 0 and table.size == 3


def test_insert_batch_the_limiter_can_never_admit_is_rejected(make_table):
    table = make_table(max_size=20, rate_limiter=SampleToInsertRatio(1.0, 1, 2.0))
    with pytest.raises(DeadlockError, match="insert"):
        table.insert(rows(0, 5), timeout=SHORT)
    assert table.info().inserts == 0 and table.size == 0 and table.store.next_id == 0


def test_table_that_can_never_reach_min_size_to_sample_is_rejected(make_table):
    with pytest.raises(DeadlockError) as err:
        make_table(max_size=5, rate_limiter=MinSize(6))
    assert "min_size_to_sample" in str(err.value) and "max_size" in str(err.value)


INVALID = [
    ("samples_per_insert zero", lambda: RateLimiter(0.0, 1, 0.0, 1.0), "samples_per_insert"),
    ("samples_per_insert negative", lambda: RateLimiter(-1.0, 1, -5.0, 5.0), "samples_per_insert"),
    ("min_size_to_sample zero", lambda: RateLimiter(1.0, 0, 0.0, 5.0), "min_size_to_sample"),
    ("min_size_to_sample float", lambda: RateLimiter(1.0, 1.5, 0.0, 5.0), "min_size_to_sample"),
    ("min_diff above max_diff", lambda: RateLimiter(1.0, 1, 5.0, 0.0), "min_diff"),
    ("min_diff nan", lambda: RateLimiter(1.0, 1, float("nan"), 5.0), "min_diff"),
    ("ratio negative error_buffer", lambda: SampleToInsertRatio(1.0, 1, -1.0), "error_buffer"),
    ("ratio min size zero", lambda: SampleToInsertRatio(1.0, 0, 5.0), "min_size_to_sample"),
    ("queue size zero", lambda: Queue(0), "size"),
    ("stack size negative", lambda: Stack(-2), "size"),
    ("min size zero", lambda: MinSize(0), "min_size_to_sample"),
]


@pytest.mark.parametrize("factory,word", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_limiter_arguments_are_rejected_naming_the_argument(factory, word):
    with pytest.raises(InvalidArgumentError) as err:
        factory()
    assert word in str(err.value)


def test_insert_batch_the_rule_admits_now_is_not_rejected_as_a_deadlock(make_table):
    # diff after 5 inserts is 10 <= max_diff 11, so the batch proceeds at once.
    table = make_table(max_size=20, rate_limiter=SampleToInsertRatio(2.0, 4, 3.0))
    table.insert(rows(0, 5), timeout=SHORT)
    assert table.info().inserts == 5


def test_sample_batch_reachable_through_the_min_size_inserts_is_not_rejected(make_table):
    # RateLimiter(1, 3, 0, 2): inserting the first 3 items takes diff to 3 > max_diff,
    # after which a batch of 3 is admitted (diff 0 >= min_diff).
    table = make_table(max_size=20, rate_limiter=RateLimiter(1.0, 3, 0.0, 2.0))
    worker = Worker(lambda: table.sample(3, timeout=5.0))
    worker.start()
    time.sleep(0.05)
    table.insert(rows(0, 3))
    assert len(worker.finish()) == 3


@settings(max_examples=300, deadline=None)
@given(
    spi=st.floats(0.25, 64.0),
    min_size=st.integers(1, 200),
    buffer_inserts=st.floats(1.0, 200.0),
)
def test_when_a_writer_pack_goes_in_the_sampler_still_has_a_pack_of_samples_to_draw(
    spi, min_size, buffer_inserts
):
    """Writers insert packs of ``insert_pack(insert_window())`` items. Samples drain
    ``diff`` from above: at the highest ``diff`` where the next pack is admitted, the
    sampler may still draw at least a pack's worth of samples before ``min_diff`` blocks
    it, so inserting and sampling overlap instead of taking turns (a pack of the whole
    window is admitted only once the sampler is blocked)."""
    limiter = SampleToInsertRatio(spi, min_size, error_buffer=max(1.0, spi, buffer_inserts * spi))
    window = limiter.insert_window()
    pack = insert_pack(window)
    assert 1 <= pack <= window
    highest_admitting = limiter.max_diff - pack * spi
    samples_left = highest_admitting - limiter.min_diff
    if window >= 2:
        assert samples_left >= pack * spi * (1 - 1e-9)
    if window == int((limiter.max_diff - limiter.min_diff) / spi):
        whole = limiter.max_diff - window * spi  # where a whole-window insert goes in
        # ... the sampler has at most one insert's samples left
        assert whole - limiter.min_diff <= spi * (1 + 1e-9)


def test_insert_pack_of_an_unbounded_window_is_unbounded():
    assert math.isinf(insert_pack(MinSize(10).insert_window()))
    assert insert_pack(1) == 1 and insert_pack(7) == 3
