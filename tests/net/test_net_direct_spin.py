"""The server's polling wait after a call on a direct link: its setting is read when the
server is made, other clients and parked calls are served on time while a link's client
in another process keeps it polling, an idle server sleeps again, and a client thread of
the server's own process never makes it poll."""

from __future__ import annotations

import resource
import time

import numpy as np
import pytest
from netprocs import CTX, awaited_updates
from test_net_direct import wait_for

import rlreplay
from rlreplay.core.cpus import cpus
from rlreplay.errors import InvalidArgumentError, RateLimiterTimeoutError
from rlreplay.net import direct
from rlreplay.runtime.stop_flag import StopFlag

pytestmark = pytest.mark.skipif(not direct.supported(), reason="needs AF_UNIX SOCK_SEQPACKET")

LONG_SPIN_US = "10000"  # 10 ms: a link client's calls keep the dispatcher polling


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
def spin_setting(monkeypatch):
    """Set ``RLREPLAY_DIRECT_SPIN_US`` for the servers a test makes (read once a process)."""

    def set_to(text: str) -> None:
        monkeypatch.setenv(direct.SPIN_VARIABLE, text)
        direct.spin_seconds.cache_clear()

    yield set_to
    direct.spin_seconds.cache_clear()


@pytest.fixture
def polling_server(spin_setting):
    if cpus() < 2:
        pytest.skip("the server never polls on one CPU")
    spin_setting(LONG_SPIN_US)
    server = rlreplay.Server(tables()).start()
    assert server._direct.spin_s == pytest.approx(0.01)
    yield server
    server.stop()


def test_a_server_refuses_a_bad_spin_setting_when_made(spin_setting):
    spin_setting("soon")
    with pytest.raises(InvalidArgumentError, match=direct.SPIN_VARIABLE):
        rlreplay.Server(tables())
    rlreplay.Server(tables(), direct_calls=False)  # not read without links


def test_zeromq_clients_and_parked_deadlines_are_served_while_a_link_keeps_it_polling(
    polling_server,
):
    out, stop = CTX.Queue(), StopFlag(CTX)
    child = CTX.Process(target=awaited_updates, args=(polling_server.address, 10**9, out, stop))
    child.start()
    try:
        assert out.get(timeout=30.0) is True  # the child's calls take its link
        # and make the dispatcher poll (set just after it sent the first reply)
        assert wait_for(lambda: polling_server._direct.spin_until > 0, 5.0)
        plain = rlreplay.Client(polling_server.address, direct_calls=False, call_timeout=5.0)
        for i in range(20):  # ZeroMQ requests are served between the link's calls
            plain.insert("starved", {"x": np.float32(i)}, wait=True)
        assert plain.info("starved").size == 20
        began = time.monotonic()
        with pytest.raises(RateLimiterTimeoutError):
            plain.sample("starved", 1, timeout=0.3)  # parked; answered at its deadline
        waited = time.monotonic() - began
        assert 0.25 <= waited < 1.5, waited
        plain.close()
        stop.set()
        assert out.get(timeout=30.0) > 0
    finally:
        stop.set()
        child.join(30.0)
        if child.is_alive():
            child.kill()
            child.join(5.0)


def test_an_idle_server_sleeps_after_the_calls_on_its_links(polling_server):
    out, stop = CTX.Queue(), StopFlag(CTX)
    child = CTX.Process(target=awaited_updates, args=(polling_server.address, 200, out, stop))
    child.start()
    try:
        assert out.get(timeout=30.0) is True
        assert out.get(timeout=30.0) == 200
    finally:
        child.join(30.0)
    before = cpu_seconds()
    time.sleep(1.0)
    used = cpu_seconds() - before
    # a dispatcher that kept polling would use the whole second
    assert used < 0.5, f"the idle server process used {used:.2f} s of CPU in 1 s"


def test_a_client_thread_of_the_servers_own_process_never_makes_it_poll(polling_server):
    client = rlreplay.Client(polling_server.address)
    keys = client.insert("prio", {"x": np.zeros(100, np.float32)}, wait=True)
    for _ in range(50):
        client.update_priorities("prio", keys, np.ones(len(keys)))
    assert client._transport.channel().direct is not None  # the calls took the link
    assert polling_server._direct.spin_until == 0.0
    client.close()
