"""Direct links: a same-host client's small awaited calls over a Unix socket beside ZeroMQ.

The same answers as over ZeroMQ, the thread's order kept, fallbacks (off switches, large
requests and replies, a refused token), and faults (a server killed with a call on the
link, a client killed with ``kill -9``)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from netprocs import CTX, config, direct_calls_then_wait, served, wait_until_stopped

import rlreplay
from rlreplay.errors import InvalidArgumentError, ServerUnavailableError
from rlreplay.net import direct
from rlreplay.runtime.stop_flag import StopFlag

pytestmark = pytest.mark.skipif(not direct.supported(), reason="needs AF_UNIX SOCK_SEQPACKET")

SIGNATURE = {"obs": {"shape": [3], "dtype": "float32"}, "step": "int64"}
CONFIG = config(
    {"name": "t", "signature": SIGNATURE, "capacity": 5000, "sampler": {"type": "Prioritized"}}
)


def rows(n: int, first: int = 0) -> dict:
    return {"obs": np.ones((n, 3), np.float32), "step": np.arange(first, first + n)}


def link_of(client: rlreplay.Client):
    return client._transport.channel().direct


def server_links(name: str) -> int:
    """Links the server with listening socket ``name`` holds (its accepted sockets show
    the listener's name in /proc/net/unix; the clients' ends show none)."""
    with open("/proc/net/unix") as f:
        paths = [line.split()[-1] for line in f.readlines()[1:] if len(line.split()) >= 8]
    return paths.count("@" + name) - 1  # less the listening socket


def wait_for(condition, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_awaited_calls_take_the_link_and_answer_as_over_zeromq():
    with served(CONFIG) as (address, _):
        fast = rlreplay.Client(address)
        plain = rlreplay.Client(address, direct_calls=False)
        keys = fast.insert("t", rows(100), wait=True)
        assert fast.update_priorities("t", keys[:50], np.full(50, 2.0)) == 50
        assert link_of(fast) is not None and link_of(plain) is None
        assert plain.update_priorities("t", keys[50:], 3.0) == 50
        assert fast.info("t") == plain.info("t")
        assert fast.can_sample("t", 10) and fast.can_insert("t", 10)
        assert fast.delete("t", keys[:10]) == 10
        assert plain.delete("t", keys[10:20]) == 10
        assert fast.info("t").size == 80
        s = plain.sample("t", 2000)
        got = dict(zip(s.info.keys.tolist(), s.info.priorities.tolist(), strict=True))
        assert {got[k] for k in keys[20:50].tolist() if k in got} == {2.0}
        assert {got[k] for k in keys[50:].tolist() if k in got} == {3.0}
        # errors are the same typed errors, raised from the link
        with pytest.raises(InvalidArgumentError, match="table"):
            fast.update_priorities("nope", keys[:2], 1.0)
        with pytest.raises(InvalidArgumentError):
            fast.update_priorities("t", keys[:2], -1.0)
        assert link_of(fast) is not None
        fast.reset("t")
        assert plain.info("t").size == 0
        fast.close()
        plain.close()


def test_a_thread_reads_its_own_pipelined_inserts_and_unawaited_updates():
    """A request takes the link only once the server took what the thread sent through
    ZeroMQ: pipelined inserts, then ``info`` at once, always see every row."""
    with served(CONFIG) as (address, _):
        client = rlreplay.Client(address)
        client.info("t")
        assert link_of(client) is not None
        total = 0
        for i in range(60):
            client.insert("t", rows(3, total))  # pipelined, through ZeroMQ
            total += 3
            assert client.info("t").size == total, i
        keys = client.insert("t", rows(4, total), wait=True)
        assert client.delete("t", keys) == 4
        stale = client.info("t").stale_updates
        for i in range(30):
            # updates of items no longer held, unawaited: each counts as stale
            client.update_priorities("t", keys, float(i + 1), wait=False)
            assert client.info("t").stale_updates == stale + 4 * (i + 1), i
        assert link_of(client) is not None
        client.close()


def test_large_requests_and_replies_and_switched_off_servers_use_zeromq():
    tables = [
        {"name": f"table_with_a_long_name_{i:04d}_" + "x" * 200, "signature": SIGNATURE,
         "capacity": 8}
        for i in range(150)
    ]  # fmt: skip
    with served(config(*tables, CONFIG["table"][0])) as (address, _):
        client = rlreplay.Client(address)
        keys = client.insert("t", rows(5000), wait=True)
        # 5000 keys and priorities: 80 KB, more than a link message
        assert client.update_priorities("t", keys, 2.0) == 5000
        assert link_of(client) is not None
        # every table's info is a reply larger than a link message: it comes by ZeroMQ,
        # and the link says so at once (the call does not wait on the link alone)
        for _ in range(3):
            start = time.monotonic()
            info = client.server_info()
            assert time.monotonic() - start < 1.0
        assert len(info) == 151 and info["t"]["size"] == 5000
        assert client.update_priorities("t", keys[:10], 1.0) == 10
        client.close()
    with served(CONFIG, direct_calls=False) as (address, _):
        client = rlreplay.Client(address)
        keys = client.insert("t", rows(5), wait=True)
        assert client.update_priorities("t", keys, 2.0) == 5
        assert link_of(client) is None
        client.close()
    with pytest.raises(InvalidArgumentError, match="direct_calls"):
        rlreplay.Client("tcp://127.0.0.1:5555", direct_calls=1)


def test_the_server_refuses_a_wrong_token_and_expires_unused_ones():
    table = rlreplay.Table("t", signature={"x": "float32"}, max_size=10)
    with rlreplay.Server([table]) as server:
        client = rlreplay.Client(server.address)
        client.info("t")
        name = link_of(client).name
        links = server._direct
        offer = links.offer(b"someone", time.monotonic())
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(5.0)
            s.connect("\0" + name)
            s.send(b"x" * direct.TOKEN_BYTES)  # not a token it gave
            assert s.recv(64) == b""  # closed
        with pytest.raises(OSError):
            direct.DirectLink.open({"name": name, "token": b"y" * 16}, None)
        # an expired token is refused too
        links._tokens[offer["token"]] = (b"someone", time.monotonic() - 1.0)
        with pytest.raises(OSError):
            direct.DirectLink.open(offer, None)
        assert wait_for(lambda: len(links.peers) == 1, 5.0)  # the client's own link
        assert client.can_insert("t")
        client.close()
        assert wait_for(lambda: not links.peers, 5.0)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_the_server_refuses_a_link_from_another_user():
    table = rlreplay.Table("t", signature={"x": "float32"}, max_size=10)
    with rlreplay.Server([table]) as server:
        offer = server._direct.offer(b"someone", time.monotonic())
        pid = os.fork()
        if pid == 0:  # a child that becomes another user, then presents a valid token
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                direct.DirectLink.open(offer, time.monotonic() + 5.0)
            except OSError:
                code = 0  # refused
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert offer["token"] in server._direct._tokens  # never presented to the server


def test_a_killed_client_leaves_no_link_and_a_killed_server_fails_the_call_on_it():
    with served(CONFIG) as (address, server):
        client = rlreplay.Client(address, call_timeout=30.0)
        keys = client.insert("t", rows(10), wait=True)
        name = link_of(client).name
        assert server_links(name) == 1
        out, stop = CTX.Queue(), StopFlag(CTX)
        child = CTX.Process(target=direct_calls_then_wait, args=(address, "t", out, stop))
        child.start()
        try:
            assert out.get(timeout=60.0) == ("ok", name)
            assert server_links(name) >= 2
            os.kill(child.pid, signal.SIGKILL)
            child.join(10.0)
            assert wait_for(lambda: server_links(name) == 1, 10.0), server_links(name)
        finally:
            stop.set()
            child.join(10.0)
            if child.is_alive():
                child.kill()
        # a call on the link when the server dies fails at once, not after call_timeout
        outcome: dict = {}
        ready, go = threading.Event(), threading.Event()

        def update() -> None:
            client.info("t")  # this thread's own link
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
        assert server_links(name) == 2
        os.kill(server.pid, signal.SIGSTOP)
        wait_until_stopped(server.pid)
        go.set()
        # its request is on the link, unanswered (a request sent after the kill would find
        # the link closed and take ZeroMQ, waiting for its call_timeout)
        channels = client._transport._channels
        assert wait_for(lambda: any(ch.direct_sent for ch in channels), 20.0)
        os.kill(server.pid, signal.SIGKILL)
        server.join(10.0)
        waiter.join(15.0)
        assert not waiter.is_alive()
        assert isinstance(outcome["result"], ServerUnavailableError), outcome
        assert outcome["elapsed"] < 10.0, outcome
        assert server_links(name) == -1  # the listening socket is gone too
        client.close()


def test_a_call_on_the_link_that_got_no_answer_is_never_applied_later():
    with served(CONFIG) as (address, proc):
        client = rlreplay.Client(address, call_timeout=1.0)
        keys = client.insert("t", rows(4), wait=True)
        assert client.update_priorities("t", keys, 1.0) == 4
        assert link_of(client) is not None
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
        assert link_of(client) is not None
        assert set(client.sample("t", 100, timeout=5.0).info.priorities.tolist()) == {2.0}
        client.close()


def test_a_thread_that_ended_closes_its_link():
    table = rlreplay.Table("t", signature={"x": "float32"}, max_size=10)
    with rlreplay.Server([table]) as server:
        client = rlreplay.Client(server.address)
        thread = threading.Thread(target=lambda: client.info("t"))
        thread.start()
        thread.join(30.0)
        assert wait_for(lambda: len(server._direct.peers) == 0, 5.0)
        client.info("t")  # this thread's own
        assert wait_for(lambda: len(server._direct.peers) == 1, 5.0)
        client.close()
        assert wait_for(lambda: len(server._direct.peers) == 0, 5.0)


def test_links_stay_within_their_budget_and_clients_past_it_use_zeromq(monkeypatch):
    from rlreplay.net import direct_server

    monkeypatch.setattr(direct_server, "default_max_links", lambda: 2)
    table = rlreplay.Table("t", signature={"x": "float32"}, max_size=10)
    with rlreplay.Server([table]) as server:
        clients = [rlreplay.Client(server.address) for _ in range(3)]
        for c in clients:
            assert c.can_insert("t")
        assert [link_of(c) is not None for c in clients] == [True, True, False]
        assert len(server._direct.peers) == 2
        clients[0].close()
        assert wait_for(lambda: len(server._direct.peers) == 1, 5.0)
        for c in clients[1:]:
            c.close()


@pytest.mark.parametrize(("soft", "expected"), [(400, 100), (1 << 20, 1024), (3, 0)])
def test_the_link_budget_is_a_quarter_of_the_open_file_limit(monkeypatch, soft, expected):
    from rlreplay.net import direct_server

    monkeypatch.setattr(direct_server.resource, "getrlimit", lambda _: (soft, 1 << 20))
    assert direct_server.default_max_links() == expected


def test_a_failing_accept_pauses_the_listener_instead_of_waking_the_loop_again():
    from rlreplay.net.direct_server import DirectLinks

    links = DirectLinks(max_links=4)
    polled = {links.fd}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect("\0" + links.name)

            class NoDescriptorLeft:
                def accept(self):
                    raise OSError(24, "Too many open files")

            real, links.listener = links.listener, NoDescriptorLeft()
            links.accept(polled.add, polled.discard, 100.0)
            assert links.fd not in polled and not links.peers
            links.sweep(100.5, polled.add, polled.discard)
            assert links.fd not in polled  # still paused
            links.listener = real
            links.sweep(101.5, polled.add, polled.discard)
            assert links.fd in polled
            links.accept(polled.add, polled.discard, 101.5)
            assert len(links.peers) == 1  # the waiting connection, accepted now
    finally:
        links.close()


def test_a_forked_child_holds_no_copy_of_its_parents_links():
    with served(CONFIG) as (address, _):
        client = rlreplay.Client(address)
        client.info("t")
        name = link_of(client).name
        assert server_links(name) == 1
        pid = os.fork()
        if pid == 0:  # the child never uses the parent's link; it only outlives its close
            time.sleep(20.0)  # killed once checked
            os._exit(0)
        try:
            client.close()
            # the server sees the link closed at once, not when the child exits
            assert wait_for(lambda: server_links(name) == 0, 10.0), server_links(name)
        finally:
            os.kill(pid, signal.SIGKILL)  # done with it
            os.waitpid(pid, 0)


def test_a_curve_server_offers_links_only_over_its_authenticated_sessions(tmp_path):
    """Under CURVE the token travels over the authenticated, encrypted session: a client
    with authorised keys gets a link; one whose key is not authorised gets no reply at
    all, so no token, and a guessed one is refused."""
    from rlreplay.net import auth

    for name in ("server", "client", "stranger"):
        auth.keygen(tmp_path, name)
    (tmp_path / "authorized").mkdir()
    (tmp_path / "authorized" / "client.key").write_bytes((tmp_path / "client.key").read_bytes())
    table = rlreplay.Table("t", signature={"x": "float32"}, max_size=10)
    server = rlreplay.Server(
        [table],
        curve_secret_key=str(tmp_path / "server.key_secret"),
        authorized_keys=str(tmp_path / "authorized"),
    )
    with server:
        keys = {"server_public_key": str(tmp_path / "server.key")}
        client = rlreplay.Client(
            server.address, client_secret_key=str(tmp_path / "client.key_secret"), **keys
        )
        assert client.can_insert("t") and link_of(client) is not None
        stranger = rlreplay.Client(
            server.address,
            client_secret_key=str(tmp_path / "stranger.key_secret"),
            call_timeout=0.5,
            **keys,
        )
        with pytest.raises(ServerUnavailableError):
            stranger.can_insert("t")
        assert link_of(stranger) is None
        with pytest.raises(OSError):
            direct.DirectLink.open({"name": link_of(client).name, "token": b"z" * 16}, None)
        assert len(server._direct.peers) == 1  # the authorised client's alone
        client.close()
        stranger.close()
