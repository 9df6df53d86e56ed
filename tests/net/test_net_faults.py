"""The client and server under faults: restarts, dead servers, refused credentials, clients
that never read, vanish or send too much. A call that raised never takes effect later."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq
from netprocs import STEP_SIGNATURE, config, free_port, served, wait_until_stopped

import rlreplay
from rlreplay.errors import (
    InvalidArgumentError,
    ReplayTimeoutError,
    ResourceLimitError,
    ServerRestartedError,
    ServerUnavailableError,
)
from rlreplay.net.wire import auth, codec

MIN5 = {"type": "MinSize", "min_size_to_sample": 5}
CONFIG = config({"name": "t", "signature": STEP_SIGNATURE, "max_size": 100, "rate_limiter": MIN5})
GHOST_WAIT_S = 2.0  # how long a request that raised gets to show up late


def rows(n: int) -> dict:
    return {"obs": np.zeros((n, 3), np.float32), "step": np.arange(n)}


def min_size_table(**kwargs) -> rlreplay.Table:
    return rlreplay.Table(
        "t", signature={"x": "float32"}, max_size=100, rate_limiter=rlreplay.MinSize(5), **kwargs
    )


def assert_stays(read, expected, for_s: float = GHOST_WAIT_S) -> None:
    """Assert ``read()`` equals ``expected`` now and at every look for ``for_s`` seconds:
    a request that should never take effect has that long to arrive late (and fail this)."""
    deadline = time.monotonic() + for_s
    for _ in range(int(for_s / 0.05) + 1):  # bounded in count and in time
        assert read() == expected
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


class RawPeer:
    """A DEALER socket speaking the wire protocol directly (to send what a Client would
    not, or to stop reading replies)."""

    def __init__(self, address: str, rcvhwm: int = 1000):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.connect(address)
        self.ids = iter(range(1, 1 << 30))

    def send(self, header: dict, arrays: dict | None = None) -> int:
        header["id"] = rid = next(self.ids)
        self.sock.send_multipart(codec.encode(header, arrays))
        return rid

    def recv(self, timeout: float = 5.0) -> dict:
        """The next reply (the server's notices, which carry no reply, are skipped)."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            assert self.sock.poll(max(1, int(left * 1000))), f"no reply within {timeout}s"
            header = codec.decode(self.sock.recv_multipart())[0]
            if "notice" not in header:
                return header

    def close(self) -> None:
        self.sock.close(linger=0)


# --------------------------------------------------------------- restarts (12, 14)
@pytest.mark.parametrize("timeout", [None, 60.0])
def test_parked_call_fails_when_the_server_restarts_on_the_same_port(timeout):
    port = free_port()
    outcome: dict = {}
    with served(CONFIG, port=port) as (address, proc):
        client = rlreplay.Client(address, liveness_s=4.0)
        client.insert("t", rows(2))  # below min size: a sample parks

        def blocked_sample():
            start = time.monotonic()
            try:
                client.sample("t", 1, timeout=timeout)
                outcome["result"] = "sampled"
            except Exception as exc:
                outcome["result"] = exc
            outcome["elapsed"] = time.monotonic() - start

        waiter = threading.Thread(target=blocked_sample, daemon=True)
        waiter.start()
        time.sleep(0.5)
        proc.kill()
        proc.join(10.0)
        with served(CONFIG, port=port):
            waiter.join(30.0)
            assert not waiter.is_alive(), "the parked call never returned after the restart"
            assert isinstance(outcome["result"], ServerRestartedError), outcome
            assert outcome["elapsed"] < 25.0
            # this thread's next call was addressed to the old server: it is refused, too
            # (keys and state from before a restart mean nothing to the new server)
            with pytest.raises(ServerRestartedError):
                client.info("t")
            # then the client goes on with the new server
            assert client.info("t").size == 0
            assert len(client.insert("t", rows(5))) == 5
            assert len(client.sample("t", 2, timeout=5.0)) == 2
        client.close()


@pytest.mark.parametrize("contact", ["after_contact", "before_contact"])
def test_insert_that_raised_while_the_server_was_down_is_not_applied_after_restart(contact):
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    client = rlreplay.Client(address, call_timeout=1.0, liveness_s=1.0)
    if contact == "after_contact":
        with served(CONFIG, port=port) as (_, proc):
            client.insert("t", rows(2))
            proc.kill()
            proc.join(10.0)
    with pytest.raises(ServerUnavailableError):
        client.insert("t", rows(3), timeout=0.5)
    with served(CONFIG, port=port):
        # The same client's next call is answered after anything its socket still queued
        # (a socket is FIFO); then a fresh client watches for a request arriving late by
        # another way: the new server holds nothing, and goes on holding nothing.
        assert client.info("t").size == 0
        fresh = rlreplay.Client(address)
        assert_stays(lambda: fresh.info("t").size, 0)
        fresh.close()
    client.close()


def test_insert_that_raised_while_the_server_was_stalled_is_not_applied_when_it_resumes():
    """A request that reached a stopped (not dead) server after its client gave up is
    refused when the server resumes: it carries the time its client stopped waiting."""
    with served(CONFIG) as (address, proc):
        client = rlreplay.Client(address, call_timeout=5.0)
        client.insert("t", rows(2))
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_until_stopped(proc.pid)
            with pytest.raises(ServerUnavailableError):
                client.insert("t", rows(3), timeout=0.5)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        # the resumed server reads what reached it meanwhile, and refuses it
        assert_stays(lambda: client.info("t").size, 2)
        client.close()


def test_server_refuses_a_request_stamped_with_another_servers_epoch():
    table = min_size_table()
    with rlreplay.Server([table]) as server:
        peer = RawPeer(server.address)
        peer.send({"op": "ping"})
        epoch = peer.recv()["epoch"]
        assert isinstance(epoch, int) and epoch == server.epoch
        peer.send({"op": "insert", "table": "t", "epoch": epoch ^ 1}, {"data/x": np.ones(3, "f4")})
        reply = peer.recv()
        assert reply["code"] == codec.CODE_OF[ServerRestartedError] and reply["epoch"] == epoch
        peer.send({"op": "insert", "table": "t", "epoch": epoch}, {"data/x": np.ones(3, "f4")})
        assert peer.recv()["ok"]
        peer.close()
    assert table.size == 3


def test_server_refuses_a_request_that_arrives_after_its_client_gave_up():
    table = min_size_table()
    with rlreplay.Server([table]) as server:
        peer = RawPeer(server.address)
        peer.send({"op": "ping"})
        server_now = peer.recv()["now"]
        late = {"op": "insert", "table": "t", "expires": server_now - 1.0}
        peer.send(late, {"data/x": np.ones(3, "f4")})
        assert peer.recv()["code"] == codec.CODE_OF[ReplayTimeoutError]
        # a parked call ends at its expiry even when its own timeout is longer
        peer.send({"op": "sample", "table": "t", "batch_size": 1, "timeout": 30.0,
                   "expires": server_now + 1.5})  # fmt: skip
        start = time.monotonic()
        reply = peer.recv(timeout=10.0)
        assert reply["code"] == codec.CODE_OF[rlreplay.RateLimiterTimeoutError]
        assert time.monotonic() - start < 5.0
        peer.close()
    assert table.size == 0 and table.info().samples == 0


def test_sample_result_of_every_request_in_flight_fails_on_restart():
    """Requests outstanding on one socket all fail with ServerRestartedError at once."""
    port = free_port()
    with served(CONFIG, port=port) as (address, proc):
        client = rlreplay.Client(address, liveness_s=4.0)
        client.insert("t", rows(2))
        rids = [client.sample_async("t", 1, timeout=None) for _ in range(3)]
        time.sleep(0.3)
        proc.kill()
        proc.join(10.0)
        with served(CONFIG, port=port):
            for rid in rids:
                with pytest.raises(ServerRestartedError):
                    client.sample_result(rid, timeout=None)
        client.close()


# ------------------------------------------------------------- timeouts (13)
@pytest.fixture(scope="module")
def curve_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    auth.keygen(folder, "server")
    (folder / "authorized").mkdir()  # no client is authorized
    table = min_size_table()
    server = rlreplay.Server(
        [table],
        curve_secret_key=str(folder / "server.key_secret"),
        authorized_keys=str(folder / "authorized"),
    ).start()
    yield server.address, str(folder / "server.key")
    server.stop()


CURVE_CALLS = {
    "insert": lambda c: c.insert("t", {"x": np.ones(2)}, timeout=1.0),
    "sample": lambda c: c.sample("t", 1, timeout=1.0),
    "sample_async": lambda c: c.sample_result(c.sample_async("t", 1, timeout=1.0), timeout=1.0),
    "ping": lambda c: c.ping(timeout=1.0),
}


@pytest.mark.parametrize("call", sorted(CURVE_CALLS))
def test_call_refused_by_curve_honours_its_own_timeout(curve_server, call):
    address, server_key = curve_server
    client = rlreplay.Client(address, server_public_key=server_key, call_timeout=30.0)
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError):
        CURVE_CALLS[call](client)
    # 1 s plus the reply grace, and not call_timeout
    assert time.monotonic() - start < 3.5
    client.close()


# -------------------------------------------------------------- memory (15)
BIG = config({"name": "big", "signature": {"x": {"shape": [1024], "dtype": "float32"}},
              "max_size": 256})  # fmt: skip
BATCH_BYTES = 256 * 4096


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_client_that_never_reads_replies_cannot_grow_server_memory_without_bound():
    limit = 4 * BATCH_BYTES
    requests = 120  # unbounded, the server would hold ~100 of these 1 MiB replies
    with served(BIG, max_unread_bytes=limit) as (address, proc):
        client = rlreplay.Client(address)
        client.insert("big", {"x": np.ones((256, 1024), np.float32)})
        client.sample("big", 256)
        before = rss_bytes(proc.pid)
        peer = RawPeer(address, rcvhwm=1)
        for _ in range(requests):
            peer.send({"op": "sample", "table": "big", "batch_size": 256, "timeout": None})
        samples, deadline = -1, time.monotonic() + 20.0
        while time.monotonic() < deadline:  # until the server has answered every request
            time.sleep(0.3)
            now = client.info("big").samples
            if now == samples:
                break
            samples = now
        grown = rss_bytes(proc.pid) - before
        assert grown < 48 * 2**20, f"server memory grew by {grown / 2**20:.0f} MiB"
        replies = [peer.recv(timeout=10.0) for _ in range(requests)]
        served_ok = sum(bool(r["ok"]) for r in replies)
        refused = [r for r in replies if not r["ok"]]
        assert refused and all(r["code"] == codec.CODE_OF[ResourceLimitError] for r in refused)
        assert served_ok >= 4 and client.info("big").samples == 256 * (served_ok + 1)
        # a client that reads again is served again, and others never stopped being served
        peer.send({"op": "sample", "table": "big", "batch_size": 1, "timeout": None})
        assert peer.recv()["ok"]
        peer.close()
        client.close()


def test_parked_calls_per_client_are_bounded():
    table = min_size_table()
    with rlreplay.Server([table], max_parked_per_client=2) as server:
        peer = RawPeer(server.address)
        for _ in range(3):
            peer.send({"op": "sample", "table": "t", "batch_size": 1, "timeout": None})
        reply = peer.recv()
        assert reply["code"] == codec.CODE_OF[ResourceLimitError] and reply["id"] == 3
        # another client is not limited by this one
        other = rlreplay.Client(server.address)
        rid = other.sample_async("t", 1, timeout=None)
        other.insert("t", {"x": np.ones(5)})
        assert len(other.sample_result(rid, timeout=5.0)) == 1
        assert {peer.recv()["id"], peer.recv()["id"]} == {1, 2}
        peer.close()
        other.close()


def test_call_parked_without_timeout_by_a_silent_client_expires():
    table = min_size_table()
    with rlreplay.Server([table], parked_expiry_s=0.3) as server:
        peer = RawPeer(server.address)
        peer.send({"op": "sample", "table": "t", "batch_size": 1, "timeout": None})
        start = time.monotonic()
        reply = peer.recv(timeout=10.0)  # without the expiry it would wait forever
        assert reply["code"] == codec.CODE_OF[ReplayTimeoutError]
        assert 0.25 < time.monotonic() - start < 10.0
        assert not server._parked
        # a client waiting without a timeout pings, so it keeps its parked call
        client = rlreplay.Client(server.address, liveness_s=0.1)
        outcome: list = []
        waiter = threading.Thread(
            target=lambda: outcome.append(len(client.sample("t", 1, timeout=None)))
        )
        waiter.start()
        time.sleep(1.0)
        table.insert({"x": np.ones(5)})
        waiter.join(10.0)
        assert outcome == [1]
        peer.close()
        client.close()


def test_message_larger_than_the_server_accepts_is_refused_before_it_is_sent():
    signature = {"x": ((1024,), "float32"), "y": ((1024,), "float32")}
    table = rlreplay.Table("t", signature=signature, max_size=64)
    with rlreplay.Server([table], max_message_bytes=96 * 1024) as server:
        client = rlreplay.Client(server.address)
        block = np.ones((8, 1024), np.float32)
        client.insert("t", {"x": block, "y": block})  # 64 KiB passes
        with pytest.raises(InvalidArgumentError, match="max_message_bytes"):
            client.insert("t", {"x": np.ones((16, 1024), np.float32), "y": block.repeat(2, 0)})
        # a peer that sends one anyway: several frames each under the limit are refused
        # together, a larger frame gets the peer cut off; the server goes on serving
        peer = RawPeer(server.address)
        big = np.ones((20, 1024), np.float32)  # 80 KiB per frame, 160 KiB in all
        header = {"op": "insert", "table": "t", "id": 7}
        peer.sock.send_multipart(codec.encode(header, {"data/x": big, "data/y": big}))
        assert peer.recv()["code"] == codec.CODE_OF[InvalidArgumentError]
        peer.send({"op": "insert", "table": "t"}, {"data/x": np.ones((32, 1024), np.float32)})
        time.sleep(0.3)
        assert client.info("t").size == 8
        peer.close()
        client.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_message_bytes": 0},
        {"max_unread_bytes": -1},
        {"max_parked_per_client": 0},
        {"parked_expiry_s": "1"},
    ],
)
def test_server_rejects_limits_that_are_not_positive_numbers(kwargs):
    with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
        rlreplay.Server([min_size_table()], **kwargs)


def test_serve_command_passes_its_per_client_limits_to_the_server(tmp_path):
    path = tmp_path / "tables.toml"
    path.write_text('[[table]]\nname = "t"\nmax_size = 10\nsignature = { x = "float32" }\n'
                    'rate_limiter = { type = "MinSize", min_size_to_sample = 5 }\n')  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = ["serve", "--config", str(path), "--max-parked-per-client", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlreplay.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert " on tcp://" in line, proc.stderr.read() if proc.poll() is not None else line
        peer = RawPeer(line.split(" on ")[1].strip())
        for _ in range(2):
            peer.send({"op": "sample", "table": "t", "batch_size": 1, "timeout": None})
        reply = peer.recv(timeout=10.0)
        assert reply["id"] == 2 and reply["code"] == codec.CODE_OF[ResourceLimitError]
        peer.close()
    finally:
        proc.terminate()
        try:
            proc.wait(15.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5.0)
        proc.stdout.close()
        proc.stderr.close()


def test_calls_with_a_short_call_timeout_are_served():
    """The time left for a reply to travel back never eats a short call's whole budget."""
    table = min_size_table()
    with rlreplay.Server([table]) as server:
        client = rlreplay.Client(server.address, call_timeout=0.2)
        for _ in range(20):
            assert client.can_insert("t") and client.info("t").size == 0
        client.close()
