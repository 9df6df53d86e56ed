"""Direct links under faults and at their limits: a server in a process that forks,
malformed and oversized messages, messages larger than a socket's send buffer, and calls
interrupted in their wait (see ``docs/protocol.md``, "Same-host direct links")."""

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
from netprocs import served
from test_net_direct import CONFIG, link_of, rows, server_links, wait_for

import rlreplay
from rlreplay.net import direct, wire

pytestmark = pytest.mark.skipif(not direct.supported(), reason="needs AF_UNIX SOCK_SEQPACKET")


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
            time.sleep(20.0)  # killed once checked
            os._exit(0)
        try:
            server.stop()
            poller = select.poll()
            poller.register(link.fd, select.POLLIN)
            assert poller.poll(10_000), "the client's link is still open after the stop"
            # the listening socket is gone too (the child closes its copy as it starts)
            assert wait_for(lambda: server_links(link.name) == -1, 10.0)
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


class BlockedDispatcher:
    """Blocks ``server``'s dispatcher on table ``busy`` (another client's ``info`` waits
    for the table's mutex, held here) until :meth:`release`."""

    def __init__(self, server: rlreplay.Server, busy: rlreplay.Table):
        self.busy, self.released = busy, threading.Event()
        self.other = rlreplay.Client(server.address, direct_calls=False)
        held = threading.Event()

        def hold() -> None:
            with busy.mutex:
                held.set()
                self.released.wait(30.0)

        self.holder = threading.Thread(target=hold)
        self.holder.start()
        assert held.wait(30.0)
        self.blocked = threading.Thread(target=lambda: self.other.info(busy.name))
        self.blocked.start()
        time.sleep(0.5)  # the dispatcher has taken that request and waits for the table

    def release(self) -> None:
        self.released.set()
        self.holder.join(30.0)
        self.blocked.join(30.0)
        self.other.close()


def raise_interrupted(*_: object) -> None:
    raise Interrupted()


def interrupted_reset(client: rlreplay.Client, after_s: float) -> None:
    """``client.reset("t")``, interrupted by a signal after ``after_s`` seconds (SIGUSR1:
    pytest-timeout's alarm stays as it is)."""
    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    timer = threading.Timer(after_s, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        timer.start()
        with pytest.raises(Interrupted):
            client.reset("t")  # on the link, unanswered
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, previous)


def tables() -> list[rlreplay.Table]:
    return [
        rlreplay.Table("t", signature={"x": "float32"}, max_size=100),
        rlreplay.Table("u", signature={"x": "float32"}, max_size=10),
    ]


def test_a_call_interrupted_on_the_link_is_still_taken_before_the_threads_next_request():
    """A call whose wait was interrupted (Ctrl-C in a notebook, say) leaves its request on
    the link, still valid; the thread's next request, through ZeroMQ, must not overtake it
    at a server busy meanwhile: a ``reset`` then an ``insert`` leave the inserted rows."""
    small, busy = tables()
    with rlreplay.Server([small, busy]) as server:
        client = rlreplay.Client(server.address, call_timeout=30.0)
        client.insert("t", {"x": np.zeros(5, np.float32)}, wait=True)
        assert client.info("t").size == 5 and link_of(client) is not None
        blocked = BlockedDispatcher(server, busy)
        try:
            interrupted_reset(client, 0.3)
            threading.Timer(0.5, blocked.released.set).start()
            client.insert("t", {"x": np.zeros(3, np.float32)}, wait=True)
            assert client.info("t").size == 3  # the reset came first, as it was sent
        finally:
            blocked.release()
        client.close()


def test_the_next_request_waits_for_an_interrupted_call_no_longer_than_its_deadline():
    """Waiting for the interrupted call's reply ends at that call's own deadline (no server
    starts it later), even if its reply never comes: the thread is never wedged."""
    small, busy = tables()
    with rlreplay.Server([small, busy]) as server:
        client = rlreplay.Client(server.address, call_timeout=1.5)
        client.insert("t", {"x": np.zeros(5, np.float32)}, wait=True)
        link = link_of(client)
        assert link is not None
        blocked = BlockedDispatcher(server, busy)
        try:
            deadline = time.monotonic() + 1.5
            interrupted_reset(client, 0.2)
        finally:
            blocked.release()
        poller = select.poll()
        poller.register(link.fd, select.POLLIN)
        assert poller.poll(10_000)
        assert link.sock.recv(direct.DIRECT_MAX_BYTES)  # its reply, lost to the client
        time.sleep(max(0.0, deadline - time.monotonic()) + 0.1)
        start = time.monotonic()
        client.insert("t", {"x": np.zeros(3, np.float32)}, wait=True, timeout=5.0)
        assert time.monotonic() - start < 1.0  # not waiting for the lost reply
        assert client.info("t").size == 3
        assert link_of(client) is link
        client.close()
