"""A call without a timeout, parked on a server that stalls until its client gives up
(``ServerUnavailableError``), is never applied when the server resumes: every message of a
client carries a lease (when it could first give up), and the server drops such a call
once its socket's latest lease has passed."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
from netprocs import STEP_SIGNATURE, config, served
from test_net_faults import RawPeer, assert_stays, wait_until_stopped

import rlreplay
from rlreplay.errors import RateLimiterTimeoutError, ServerUnavailableError

# One insert beyond the error buffer blocks until a sample makes room.
RATIO = {"type": "SampleToInsertRatio", "samples_per_insert": 1.0, "min_size_to_sample": 1,
         "error_buffer": 1.0}  # fmt: skip
CONFIG = config({"name": "t", "signature": STEP_SIGNATURE, "max_size": 100, "rate_limiter": RATIO})
LIVENESS_S = 0.5  # the client gives up after 2 * LIVENESS_S without a reply


def rows(n: int, first: int = 0) -> dict:
    return {"obs": np.zeros((n, 3), np.float32), "step": np.arange(first, first + n)}


def fill_until_blocked(client: rlreplay.Client) -> int:
    """Insert single rows until the limiter blocks one; returns the rows stored."""
    for i in range(20):  # bounded: the limiter blocks after a few rows
        try:
            client.insert("t", rows(1, i), timeout=0.2)
        except RateLimiterTimeoutError:
            return i
    raise AssertionError("the rate limiter never blocked an insert")


def stall_until_client_gives_up(proc, call) -> BaseException | None:
    """Run ``call`` (parked without a timeout) in a thread, SIGSTOP the server, and return
    what ``call`` raised once it gave up (the server is resumed before returning)."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.3)  # the request reaches the server and parks
    assert thread.is_alive(), f"the call did not park: {raised}"
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        wait_until_stopped(proc.pid)
        thread.join(10 * LIVENESS_S + 5.0)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert not thread.is_alive(), "the client did not give up on a stopped server"
    return raised[0]


def free_limiter(address: str, n: int) -> None:
    """Sample enough (from another client) that the limiter admits the parked rows."""
    other = rlreplay.Client(address, call_timeout=5.0)
    try:
        for _ in range(n):
            other.sample("t", 1, timeout=2.0)
    finally:
        other.close()


def test_no_timeout_insert_parked_on_a_stalled_server_is_never_applied_after_it_gave_up():
    with served(CONFIG) as (address, proc):
        client = rlreplay.Client(address, call_timeout=5.0, liveness_s=LIVENESS_S)
        stored = fill_until_blocked(client)
        size = lambda: client.info("t").size  # noqa: E731

        def call() -> None:
            client.insert("t", rows(1, 100), timeout=None)

        start = time.monotonic()
        exc = stall_until_client_gives_up(proc, call)
        assert isinstance(exc, ServerUnavailableError), repr(exc)
        free_limiter(address, stored)
        # the rows the client reported failed never show up
        assert_stays(size, stored)
        assert time.monotonic() - start < 20.0
        client.close()


def test_no_timeout_insert_of_a_waiting_client_still_waits_past_its_lease():
    """Leases are renewed while the client waits: a call blocked for several give-up
    intervals on a live server is applied when the limiter makes room."""
    with served(CONFIG) as (address, _):
        client = rlreplay.Client(address, call_timeout=5.0, liveness_s=LIVENESS_S)
        stored = fill_until_blocked(client)
        keys: list = []
        thread = threading.Thread(
            target=lambda: keys.append(client.insert("t", rows(1, 100))), daemon=True
        )
        thread.start()
        time.sleep(4 * LIVENESS_S)  # twice the client's give-up interval, blocked
        assert thread.is_alive()
        free_limiter(address, stored)
        thread.join(10.0)
        assert not thread.is_alive() and len(keys) == 1 and len(keys[0]) == 1
        assert client.info("t").size == stored + 1
        client.close()


def test_a_request_arriving_after_its_lease_is_refused():
    with served(CONFIG) as (address, _):
        peer = RawPeer(address)
        peer.send({"op": "ping"})
        now = peer.recv()["now"]
        peer.send({"op": "insert", "table": "t", "lease": now - 1.0},
                  {"data/obs": np.zeros((1, 3), "f4"), "data/step": np.zeros(1, "i8")})  # fmt: skip
        reply = peer.recv()
        assert not reply["ok"] and "after its client could have given up" in reply["message"]
        peer.sock.close()
        client = rlreplay.Client(address, call_timeout=5.0)
        assert client.info("t").size == 0
        client.close()
