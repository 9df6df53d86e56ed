"""The server's polling wait after a call on a direct link: its setting is checked when the
server is made, other clients and parked calls are served on time while a link's client
keeps it polling, and an idle server sleeps again."""

from __future__ import annotations

import resource
import threading
import time

import numpy as np
import pytest

import rlreplay
from rlreplay.errors import InvalidArgumentError, RateLimiterTimeoutError
from rlreplay.net import direct

pytestmark = pytest.mark.skipif(not direct.supported(), reason="needs AF_UNIX SOCK_SEQPACKET")


def tables() -> list[rlreplay.Table]:
    prio = rlreplay.Table(
        "prio", signature={"x": "float32"}, max_size=1000, sampler=rlreplay.Prioritized(0.6)
    )
    # never enough items to sample: a sample waits (parked) until its timeout
    starved = rlreplay.Table(
        "starved", signature={"x": "float32"}, max_size=100, rate_limiter=rlreplay.MinSize(50)
    )
    return [prio, starved]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@pytest.fixture
def fresh_spin_setting():
    direct.spin_seconds.cache_clear()
    yield
    direct.spin_seconds.cache_clear()


def test_a_server_refuses_a_bad_spin_setting_when_made(monkeypatch, fresh_spin_setting):
    monkeypatch.setenv(direct.SPIN_VARIABLE, "soon")
    with pytest.raises(InvalidArgumentError, match=direct.SPIN_VARIABLE):
        rlreplay.Server(tables())
    rlreplay.Server(tables(), direct_calls=False)  # not read without links


def test_zeromq_clients_and_parked_deadlines_are_served_while_a_link_keeps_it_polling():
    server = rlreplay.Server(tables()).start()
    stop = threading.Event()
    calls = []
    try:
        fast = rlreplay.Client(server.address)
        keys = fast.insert("prio", {"x": np.zeros(200, np.float32)}, wait=True)
        prios = np.full(len(keys), 2.0)

        def hammer():  # awaited calls on the link, back to back (at most 20 s)
            end = time.monotonic() + 20.0
            while not stop.is_set() and time.monotonic() < end:
                calls.append(fast.update_priorities("prio", keys, prios))

        thread = threading.Thread(target=hammer, daemon=True)
        thread.start()
        assert fast._transport.channel().direct is not None  # the calls take the link
        plain = rlreplay.Client(server.address, direct_calls=False)
        for i in range(20):  # ZeroMQ requests are served between the link's calls
            plain.insert("starved", {"x": np.float32(i)}, wait=True)
        assert plain.info("starved").size == 20
        began = time.monotonic()
        with pytest.raises(RateLimiterTimeoutError):
            plain.sample("starved", 1, timeout=0.3)  # parked; answered at its deadline
        waited = time.monotonic() - began
        assert 0.25 <= waited < 3.0, waited
        assert len(calls) > 0 and all(n == len(keys) for n in calls)
        plain.close()
    finally:
        stop.set()
        server.stop()


def test_an_idle_server_sleeps_after_the_calls_on_its_links():
    server = rlreplay.Server(tables()).start()
    try:
        client = rlreplay.Client(server.address)
        keys = client.insert("prio", {"x": np.zeros(100, np.float32)}, wait=True)
        for _ in range(200):
            client.update_priorities("prio", keys, np.ones(len(keys)))
        assert client._transport.channel().direct is not None
        before = cpu_seconds()
        time.sleep(1.0)
        used = cpu_seconds() - before
        # a dispatcher that kept polling would use the whole second
        assert used < 0.5, f"the idle server process used {used:.2f} s of CPU in 1 s"
        client.close()
    finally:
        server.stop()
