"""A stalled server (SIGSTOP) and calls with deadlines: a timed call that gets no answer
fails alone, and requests without a deadline the thread sent meanwhile are never reported
failed while the server may still serve them."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from netprocs import STEP_SIGNATURE, config, served, wait_until_stopped

import rlreplay
from rlreplay.errors import ServerUnavailableError

CONFIG = config({"name": "t", "signature": STEP_SIGNATURE, "max_size": 100})


def rows(n: int) -> dict:
    return {"obs": np.zeros((n, 3), np.float32), "step": np.arange(n)}


@pytest.fixture
def stalled():
    """A served table holding 2 rows, a client that reached it, and stop/resume."""
    with served(CONFIG) as (address, proc):
        client = rlreplay.Client(address, call_timeout=5.0)
        client.insert("t", rows(2))

        def stop() -> None:
            os.kill(proc.pid, signal.SIGSTOP)
            wait_until_stopped(proc.pid)

        try:
            yield client, stop, lambda: os.kill(proc.pid, signal.SIGCONT)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            client.close()


def test_a_timed_call_without_answer_fails_alone(stalled):
    client, stop, resume = stalled
    stop()
    rid = client.sample_async("t", 2)  # no deadline: the server may still serve it
    with pytest.raises(ServerUnavailableError):
        client.sample("t", 1, timeout=0.5)
    resume()
    # the request without a deadline was not reported failed: the resumed server served it
    assert len(client.sample_result(rid, timeout=10.0)) == 2
    assert client.info("t").samples == 2  # its 2 items; the timed call was not served
    assert len(client.sample("t", 2, timeout=5.0)) == 2


def test_an_async_sample_that_got_no_answer_is_never_applied_later(stalled):
    client, stop, resume = stalled
    keys = client.sample("t", 2, timeout=5.0).info.keys
    samples = client.info("t").samples
    stop()
    rid = client.sample_async("t", 1, timeout=0.5, update=(keys, 9.0))
    with pytest.raises(ServerUnavailableError):
        client.sample_result(rid, timeout=0.5)
    resume()
    # the resumed server refuses the request it reached after its client gave up
    info = client.info("t")
    assert info.samples == samples
    batch = client.sample("t", 2, timeout=5.0)
    assert not np.any(batch.info.priorities == 9.0)


PRIO = config({"name": "p", "signature": STEP_SIGNATURE, "max_size": 100,
               "sampler": {"type": "Prioritized", "priority_exponent": 1.0}})  # fmt: skip


def test_priority_updates_a_failed_request_did_not_carry_go_with_a_later_one():
    with served(PRIO) as (address, proc):
        client = rlreplay.Client(address, call_timeout=1.0, liveness_s=0.5)
        keys = client.insert("p", rows(10), 1.0)
        it = client.sample_iterator("p", 4, in_flight=1, timeout=1.0)
        next(it)
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until_stopped(proc.pid)
        try:
            with pytest.raises(ServerUnavailableError):
                next(it)
            it.update_priorities(keys, np.full(10, 50.0))
            with pytest.raises(ServerUnavailableError):
                next(it)  # its request was not sent: the update stays queued
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        next(it)
        it.close()
        assert set(client.sample("p", 100, timeout=5.0).info.priorities.tolist()) == {50.0}
        client.close()
