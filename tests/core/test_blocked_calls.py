"""Blocked calls: one deadline per call, one warning naming the table and the cause."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from rlreplay import MinSize, SampleToInsertRatio, StepStore, Table, TrajectoryWriter
from rlreplay.core import waiting
from rlreplay.errors import InvalidArgumentError, RateLimiterTimeoutError, ReplayTimeoutError

SIGNATURE = {"x": "float32"}
ROW = {"x": np.float32(1.0)}


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rlreplay"]


CASES = {
    "queue insert": (
        lambda: Table.queue("q", 1, signature=SIGNATURE, warn_after=0.05),
        "insert",
        "no sampler is consuming this queue",
    ),
    "ratio insert": (
        lambda: Table(
            "r",
            signature=SIGNATURE,
            max_size=100,
            rate_limiter=SampleToInsertRatio(1.0, 1, 1.0),
            warn_after=0.05,
        ),
        "insert",
        "the learner (sampler) is behind",
    ),
    "sample below min size": (
        lambda: Table(
            "m", signature=SIGNATURE, max_size=10, rate_limiter=MinSize(3), warn_after=0.05
        ),
        "sample",
        "no writer is inserting",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_call_blocked_past_warn_after_logs_one_warning_naming_table_and_cause(caplog, case):
    make, op, cause = case
    table = make()
    table.insert(ROW)
    if op == "insert":
        while table.can_insert():
            table.insert(ROW)
    call = table.insert if op == "insert" else table.sample
    argument = ROW if op == "insert" else 1
    with (
        caplog.at_level(logging.WARNING, logger="rlreplay"),
        pytest.raises(RateLimiterTimeoutError),
    ):
        call(argument, timeout=0.3)
    messages = warnings_of(caplog)
    assert len(messages) == 1, messages
    assert repr(table.name) in messages[0] and cause in messages[0], messages[0]
    assert f"inserts={table.rate_limiter.inserts}" in messages[0]


def test_a_call_woken_past_warn_after_and_its_deadline_still_warns(caplog):
    """On a loaded machine a blocked call may first wake after its deadline: it has
    been blocked longer than warn_after, so it logs its warning before it gives up."""
    lock = threading.RLock()
    with lock, caplog.at_level(logging.WARNING, logger="rlreplay"):
        call = waiting.BlockedCall(waiting.Waits(lock), 0.1, 0.05, lambda: "blocked too long")
        time.sleep(0.2)  # as if the first wake-up came this late
        assert not call.wait()
        assert not call.wait()
    assert warnings_of(caplog) == ["blocked too long"]


def test_a_call_that_proceeds_before_warn_after_logs_nothing(caplog):
    table = Table("t", signature=SIGNATURE, max_size=4, rate_limiter=MinSize(1), warn_after=5.0)
    timer = threading.Timer(0.1, lambda: table.insert(ROW))
    timer.start()
    with caplog.at_level(logging.WARNING, logger="rlreplay"):
        table.sample(1, timeout=5.0)
    timer.join()
    assert warnings_of(caplog) == []


def test_an_append_blocked_by_a_queue_warns_that_no_sampler_consumes_it(caplog, monkeypatch):
    monkeypatch.setattr(waiting, "WARN_AFTER_S", 0.05)
    store = StepStore(SIGNATURE, capacity=2)
    queue = Table.queue("jobs", 2, store=store)
    other = Table("other", store=store)
    queue.insert({"x": np.zeros(2, np.float32)})
    writer = TrajectoryWriter(other)
    with caplog.at_level(logging.WARNING, logger="rlreplay"), pytest.raises(ReplayTimeoutError):
        writer.append(ROW, timeout=0.3)
    messages = warnings_of(caplog)
    assert len(messages) == 1, messages
    assert "'jobs'" in messages[0] and "no sampler is consuming that queue" in messages[0]


def test_insert_timeout_bounds_the_limiter_and_the_store_waits_together():
    store = StepStore(SIGNATURE, capacity=2)
    other = Table.queue("other", 2, store=store)
    table = Table.queue("t", 1, store=store)
    other.insert(ROW)  # row 0: the other queue's item, which nobody samples
    table.insert(ROW)  # row 1: the table is full, its limiter blocks the next insert
    timer = threading.Timer(1.0, lambda: table.sample(1))  # the limiter admits at 1 s
    timer.start()
    start = time.monotonic()
    # Either wait may be the one that times out (on a loaded machine the timer can fire
    # late); what is checked is that both together take the call's timeout, not 3 s each.
    with pytest.raises(ReplayTimeoutError):
        table.insert(ROW, timeout=3.0)  # then row 0 blocks it in the store
    elapsed = time.monotonic() - start
    timer.join()
    assert 2.9 <= elapsed < 3.8, elapsed  # the two waits one after the other: 4 s
    assert table.info().insert_blocked_s == pytest.approx(elapsed, abs=0.5)


def test_warn_after_must_be_a_positive_number():
    with pytest.raises(InvalidArgumentError, match="warn_after"):
        Table("t", signature=SIGNATURE, max_size=2, warn_after=0)


def test_a_blocked_call_is_woken_only_once_what_it_waits_for_holds():
    """Changes that leave a call's condition false do not wake it (a learner's every
    sample would otherwise wake an actor the limiter still holds back); the change that
    makes it true does, at once; a call that states no condition wakes on every change."""
    lock = threading.RLock()
    waits = waiting.Waits(lock)
    state = {"go": False, "stated": 0, "unstated": 0}

    def blocked(stated: bool) -> None:
        with lock:
            call = waiting.BlockedCall(waits, 5.0, None, lambda: "blocked")
            while not state["go"]:
                state["stated" if stated else "unstated"] += 1
                call.wait((lambda: state["go"]) if stated else None)

    threads = [threading.Thread(target=blocked, args=(s,), daemon=True) for s in (True, False)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5.0
    while len(waits.blocked) < 2 and time.monotonic() < deadline:  # both wait
        time.sleep(0.005)
    for _ in range(20):  # changes under which the stated condition stays false
        with lock:
            waits.wake()
        time.sleep(0.01)
    assert state["stated"] == 1  # never woken (its poll is 1 s away)
    assert state["unstated"] > 5  # woken by the changes
    start = time.monotonic()
    with lock:
        state["go"] = True
        waits.wake()
    for thread in threads:
        thread.join(2.0)
    assert not any(t.is_alive() for t in threads)
    assert time.monotonic() - start < 0.5  # woken by the change, not by its poll
