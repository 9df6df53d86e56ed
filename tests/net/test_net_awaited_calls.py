"""A client's small awaited calls (``update_priorities``, ``delete``, ``info``,
``can_insert``, ``can_sample``, ``reset``): their answers and typed errors, a thread
reading its own writes, and an awaited call that got no answer never applied later."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from netprocs import config, served, wait_until_stopped

import rlreplay
from rlreplay.errors import InvalidArgumentError, ServerUnavailableError

SIGNATURE = {"obs": {"shape": [3], "dtype": "float32"}, "step": "int64"}
CONFIG = config(
    {"name": "t", "signature": SIGNATURE, "capacity": 5000, "sampler": {"type": "Prioritized"}}
)


def rows(n: int, first: int = 0) -> dict:
    return {"obs": np.ones((n, 3), np.float32), "step": np.arange(first, first + n)}


def test_awaited_calls_answer_alike_from_two_clients_and_raise_typed_errors():
    with served(CONFIG) as (address, _):
        one, two = rlreplay.Client(address), rlreplay.Client(address)
        keys = one.insert("t", rows(100))
        assert one.update_priorities("t", keys[:50], np.full(50, 2.0)) == 50
        assert two.update_priorities("t", keys[50:], 3.0) == 50
        assert one.info("t") == two.info("t")
        assert one.can_sample("t", 10) and one.can_insert("t", 10)
        assert one.delete("t", keys[:10]) == 10
        assert two.delete("t", keys[10:20]) == 10
        assert one.info("t").size == 80
        s = two.sample("t", 2000)
        got = dict(zip(s.info.keys.tolist(), s.info.priorities.tolist(), strict=True))
        assert {got[k] for k in keys[20:50].tolist() if k in got} == {2.0}
        assert {got[k] for k in keys[50:].tolist() if k in got} == {3.0}
        with pytest.raises(InvalidArgumentError, match="table"):
            one.update_priorities("nope", keys[:2], 1.0)
        with pytest.raises(InvalidArgumentError):
            one.update_priorities("t", keys[:2], -1.0)
        one.reset("t")
        assert two.info("t").size == 0
        one.close()
        two.close()


def test_a_thread_reads_its_own_inserts_and_unawaited_updates():
    with served(CONFIG) as (address, _):
        client = rlreplay.Client(address)
        total = 0
        for i in range(60):
            client.insert("t", rows(3, total))
            total += 3
            assert client.info("t").size == total, i
        keys = client.insert("t", rows(4, total))
        assert client.delete("t", keys) == 4
        stale = client.info("t").stale_updates
        for i in range(30):
            # updates of items no longer held, unawaited: each counts as stale
            client.update_priorities("t", keys, float(i + 1), wait=False)
            assert client.info("t").stale_updates == stale + 4 * (i + 1), i
        client.close()


def test_an_awaited_call_that_got_no_answer_is_never_applied_later():
    with served(CONFIG) as (address, proc):
        client = rlreplay.Client(address, call_timeout=1.0)
        keys = client.insert("t", rows(4))
        assert client.update_priorities("t", keys, 1.0) == 4
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until_stopped(proc.pid)
        try:
            start = time.monotonic()
            with pytest.raises(ServerUnavailableError):
                client.update_priorities("t", keys, 9.0)
            assert time.monotonic() - start < 1.0 + 3.0  # call_timeout, diagnosis, slack
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        # the resumed server refuses the request it read after its client gave up
        batch = client.sample("t", 100, timeout=5.0)
        assert set(batch.info.priorities.tolist()) == {1.0}
        assert client.update_priorities("t", keys, 2.0) == 4
        assert set(client.sample("t", 100, timeout=5.0).info.priorities.tolist()) == {2.0}
        client.close()


def test_an_awaited_call_fails_within_its_timeout_when_the_server_is_killed():
    with served(CONFIG) as (address, server):
        client = rlreplay.Client(address, call_timeout=5.0)
        keys = client.insert("t", rows(10))
        outcome: dict = {}
        ready, go = threading.Event(), threading.Event()

        def update() -> None:
            client.info("t")  # this thread's own socket, greeted
            ready.set()
            go.wait(30.0)
            start = time.monotonic()
            try:
                client.update_priorities("t", keys, 2.0)
                outcome["result"] = "answered"
            except Exception as exc:
                outcome["result"] = exc
            outcome["elapsed"] = time.monotonic() - start

        waiter = threading.Thread(target=update)
        waiter.start()
        assert ready.wait(30.0)
        os.kill(server.pid, signal.SIGSTOP)
        wait_until_stopped(server.pid)
        go.set()
        time.sleep(0.2)  # its request is on its way, unanswered
        os.kill(server.pid, signal.SIGKILL)
        server.join(10.0)
        waiter.join(20.0)
        assert not waiter.is_alive()
        assert isinstance(outcome["result"], ServerUnavailableError), outcome
        assert outcome["elapsed"] < 5.0 + 3.0, outcome  # call_timeout, diagnosis, slack
        client.close()
