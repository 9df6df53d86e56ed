"""Direct links: a same-host client's small awaited calls over a Unix socket beside ZeroMQ.

The same answers as over ZeroMQ, the thread's order kept, fallbacks (off switches, large
requests and replies, a refused token), and faults (a server killed with a call on the
link, a client killed with ``kill -9``)."""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
from netprocs import CTX, config, direct_calls_then_wait, served, wait_until_stopped

import rlreplay
from rlreplay.errors import InvalidArgumentError, ServerUnavailableError
from rlreplay.net import direct, wire
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
            time.sleep(3.0)
            os._exit(0)
        try:
            client.close()
            # the server sees the link closed at once, not when the child exits
            assert wait_for(lambda: server_links(name) == 0, 2.0), server_links(name)
        finally:
            os.kill(pid, signal.SIGKILL)  # done with it
            os.waitpid(pid, 0)


def test_a_server_forked_into_a_child_still_closes_its_links_when_it_stops():
    """A child forked from a process that hosts a server (a fork-based vector env, say)
    holds no copy of the server's links or listening socket: when the server stops, its
    clients see their links closed at once, even while the child lives on."""
    table = rlreplay.Table("t", signature={"x": "float32"}, max_size=10)
    server = rlreplay.Server([table]).start()
    try:
        client = rlreplay.Client(server.address)
        client.info("t")
        link = link_of(client)
        assert server_links(link.name) == 1
        pid = os.fork()
        if pid == 0:  # the child never serves; it only outlives the server's stop
            time.sleep(3.0)
            os._exit(0)
        try:
            server.stop()
            poller = select.poll()
            poller.register(link.fd, select.POLLIN)
            assert poller.poll(2000), "the client's link is still open after the stop"
            assert server_links(link.name) == -1  # the listening socket is gone too
        finally:
            os.kill(pid, signal.SIGKILL)  # done with it
            os.waitpid(pid, 0)
        client.close()
    finally:
        server.stop()


def offered_link(address: str) -> tuple[zmq.Socket, direct.DirectLink]:
    """A link opened as a client's handshake opens one: a ZeroMQ ``ping`` asking for it,
    then the offered token on the server's listening socket. Returns the ZeroMQ socket
    too (the link's requests count as its connection's) and the link, blocking with a
    timeout."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    sock.send_multipart(wire.encode({"op": "ping", "id": 1, "direct": True}))
    assert sock.poll(30_000), "no reply to the handshake ping"
    offer = wire.decode(sock.recv_multipart())[0]["direct"]
    link = direct.DirectLink.open(offer, time.monotonic() + 10.0)
    link.sock.setblocking(True)
    link.sock.settimeout(5.0)
    return sock, link


def fuzz_message(rng: np.random.Generator) -> bytes:
    """A malformed or odd link message: random bytes, a wrong length prefix, a header that
    is not a map, requests with fields of the wrong types, arrays that do not fit."""
    kind = int(rng.integers(5))
    noise = rng.bytes(int(rng.integers(0, 40)))
    if kind == 0:
        return noise
    if kind == 1:
        return struct.pack("<I", int(rng.integers(1 << 32))) + noise
    ops = ["info", "delete", "update_priorities", "can_insert", "reset", "ping", "nope"]
    header = {
        "op": ops[int(rng.integers(len(ops)))],
        "v": [1, 2, 3, "2", None][int(rng.integers(5))],
        "id": [7, -1, "x", None, [1]][int(rng.integers(5))],
        "table": ["t", 3, None, "u"][int(rng.integers(4))],
        "epoch": [None, "e", 1.5][int(rng.integers(3))],
    }
    if kind == 2:
        header["arrays"] = [
            [{"name": "keys", "dtype": "<i8", "shape": [3]}],
            [{"name": "keys", "dtype": "O", "shape": [1 << 40]}],
            "arrays",
            [[1, 2]],
        ][int(rng.integers(4))]
    packed = msgpack.packb(header if kind != 3 else list(header.values()))
    return struct.pack("<I", len(packed)) + packed + (noise if kind == 4 else b"")


def test_malformed_and_oversized_link_messages_neither_crash_nor_wedge_the_server():
    with served(CONFIG) as (address, proc):
        client = rlreplay.Client(address)
        keys = client.insert("t", rows(5), wait=True)
        rng = np.random.default_rng(0)
        sock, link = offered_link(address)
        outcomes = {"answered": 0, "closed": 0}
        try:
            for _ in range(150):
                link.sock.send(fuzz_message(rng))
                reply = link.sock.recv(direct.DIRECT_MAX_BYTES)
                if reply:  # a reply (an error, but for a well-formed ping), on the link
                    header = wire.decode(direct.frames_of(reply))[0]
                    assert header["ok"] is (header.get("code") is None), header
                    outcomes["answered"] += 1
                else:  # not a link message: the server closed this link
                    outcomes["closed"] += 1
                    link.close()
                    sock.close()
                    sock, link = offered_link(address)
            # a message larger than a link message closes the link
            link.sock.send(b"\0" * (direct.DIRECT_MAX_BYTES + 1000))
            assert link.sock.recv(64) == b""
        finally:
            link.close()
            sock.close()
        assert min(outcomes.values()) > 10, outcomes
        assert proc.is_alive()
        assert client.update_priorities("t", keys, 2.0) == 5  # its own link still served
        assert link_of(client) is not None
        assert client.info("t").size == 5
        client.close()


def test_messages_larger_than_a_links_send_buffer_take_zeromq_and_keep_the_link():
    """Where a socket's send buffer is smaller than a link message (a host with a low
    ``net.core.wmem_default``), a request or reply that does not fit it goes through
    ZeroMQ: the reply is not lost (the call does not wait for its timeout) and the link
    is not taken for closed."""
    tables = [
        rlreplay.Table(f"table_{i:03d}_" + "x" * 100, signature={"x": "float32"}, max_size=10)
        for i in range(40)
    ]
    tables.append(rlreplay.Table("t", signature={"x": "float32"}, max_size=5000))
    with rlreplay.Server(tables) as server:
        client = rlreplay.Client(server.address, call_timeout=10.0)
        keys = client.insert("t", {"x": np.zeros(3000, np.float32)}, wait=True)
        client.info("t")
        link = link_of(client)
        assert link is not None and len(server._direct.peers) == 1
        small = (socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # the kernel makes it 8 KiB
        next(iter(server._direct.peers.values())).sock.setsockopt(*small)
        link.sock.setsockopt(*small)
        start = time.monotonic()
        info = client.server_info()  # a reply of about 30 KB
        assert time.monotonic() - start < 5.0
        assert len(info) == 41 and info["t"]["size"] == 3000
        assert client.update_priorities("t", keys[:2000], 2.0) == 2000  # a 32 KB request
        assert link_of(client) is link
        assert client.info("t").size == 3000
        client.close()


class Interrupted(Exception):
    """Raised by a signal handler in the middle of a call (as KeyboardInterrupt is)."""


def test_a_call_interrupted_on_the_link_is_still_taken_before_the_threads_next_request():
    """A call whose wait was interrupted (Ctrl-C in a notebook, say) leaves its request on
    the link, still valid; the thread's next request, through ZeroMQ, must not overtake it
    at a server busy meanwhile: a ``reset`` then an ``insert`` leave the inserted rows."""
    small = rlreplay.Table("t", signature={"x": "float32"}, max_size=100)
    busy = rlreplay.Table("u", signature={"x": "float32"}, max_size=10)
    with rlreplay.Server([small, busy]) as server:
        client = rlreplay.Client(server.address, call_timeout=30.0)
        client.insert("t", {"x": np.zeros(5, np.float32)}, wait=True)
        assert client.info("t").size == 5 and link_of(client) is not None
        other = rlreplay.Client(server.address, direct_calls=False)
        held, release = threading.Event(), threading.Event()

        def hold() -> None:  # the server's dispatcher blocks on this table meanwhile
            with busy.mutex:
                held.set()
                release.wait(30.0)

        holder = threading.Thread(target=hold)
        blocked = threading.Thread(target=lambda: other.info("u"))
        previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Interrupted()))
        try:
            holder.start()
            assert held.wait(30.0)
            blocked.start()
            time.sleep(0.5)  # the dispatcher has taken other's request and waits for "u"
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                client.reset("t")  # on the link, unanswered
            threading.Timer(0.5, release.set).start()
            client.insert("t", {"x": np.zeros(3, np.float32)}, wait=True)
            assert client.info("t").size == 3  # the reset came first, as it was sent
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            release.set()
            holder.join(30.0)
            blocked.join(30.0)
        client.close()
        other.close()
