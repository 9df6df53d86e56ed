"""A stalled server (SIGSTOP) and calls with deadlines: a timed call that gets no answer
fails alone, and rows a thread pipelined meanwhile are never reported failed while the
server may still store them."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from netprocs import STEP_SIGNATURE, config, served, wait_until_stopped

import rlreplay
from rlreplay.errors import ReplayTimeoutError, ServerUnavailableError

CONFIG = config({"name": "t", "signature": STEP_SIGNATURE, "max_size": 100})


def rows(n: int) -> dict:
    return {"obs": np.zeros((n, 3), np.float32), "step": np.arange(n)}


@pytest.fixture
def stalled():
    """A served table holding 2 rows, a client that reached it, and stop/resume."""
    with served(CONFIG) as (address, proc):
        client = rlreplay.Client(address, call_timeout=5.0)
        client.insert("t", rows(2), wait=True)

        def stop() -> None:
            os.kill(proc.pid, signal.SIGSTOP)
            wait_until_stopped(proc.pid)

        try:
            yield client, stop, lambda: os.kill(proc.pid, signal.SIGCONT)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            client.close()


def test_a_flush_that_runs_out_keeps_the_rows_on_their_way(stalled):
    client, stop, resume = stalled
    stop()
    receipt = client.insert("t", rows(3))
    with pytest.raises(ReplayTimeoutError, match="may still be stored"):
        client.flush(timeout=0.5)
    resume()
    assert client.flush(timeout=10.0) == 3
    assert len(receipt.keys(timeout=5.0)) == 3
    assert client.info("t").size == 5  # stored once


def test_a_timed_call_without_answer_fails_alone(stalled):
    client, stop, resume = stalled
    stop()
    receipt = client.insert("t", rows(3))  # pipelined, no deadline
    with pytest.raises(ServerUnavailableError):
        client.sample("t", 1, timeout=0.5)
    resume()
    # the pipelined rows were not reported failed: the resumed server stored them
    assert len(receipt.keys(timeout=10.0)) == 3
    assert client.info("t").size == 5
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
