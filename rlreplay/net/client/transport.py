"""How a client's requests travel: one socket per thread, server epochs, deadlines.

A :class:`Transport` sends requests and awaits replies for a :class:`~rlreplay.Client`.
A call's ``timeout`` bounds all of it, a restarted server refuses requests meant for its
predecessor, and a call that raised is never applied later. See docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import zmq

from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    ReplayError,
    ReplayTimeoutError,
    ServerRestartedError,
    ServerUnavailableError,
)
from rlreplay.net.client.channel import Channel
from rlreplay.net.wire import auth, codec, framing

# Most seconds spent finding out why a call got no answer.
DIAGNOSE_S = 0.25

# A call unanswered this long logs why (once, where known): waiting is never silent.
UNANSWERED_WARN_S = 3.0

# Extra seconds a client waits past a call's timeout for the server's own timeout reply.
REPLY_GRACE_S = 0.5
UNDIAGNOSED = object()  # a wait has not looked at why its server is silent
# Latest start of a request before its client gives up (or a quarter of the time left).
EXPIRY_MARGIN_S = 0.25


class _CallTimeout:
    """``timeout`` of calls that never block: they wait ``call_timeout``."""

    def __repr__(self) -> str:
        return "CALL"


CALL: Any = _CallTimeout()


class Sender(Protocol):
    """What a client's writers and iterators send requests through (a :class:`Transport`)."""

    closed: bool

    def send(
        self,
        header: dict,
        arrays: Mapping[str, np.ndarray] | None = None,
        *,
        until: Any = CALL,
        expires: float | None = None,
    ) -> int: ...

    def wait(self, rid: int, timeout: float | None) -> tuple[dict, dict]: ...

    def forget(self, rids: Any) -> None: ...

    def cancel(self, rids: Any) -> None: ...

    def notify(self, header: dict) -> None: ...


# Milliseconds a closed socket may take to deliver its last shm_detach.
DETACH_LINGER_MS = 200


class _ThreadEnd:
    """Kept in a thread's locals beside its channel: collected when the thread ends."""


def _thread_ended(ref: weakref.ref, ch: Channel) -> None:
    """A thread that used ``ch`` ended: release its shared-memory slots."""
    transport = ref()
    if transport is not None and ch.pid == os.getpid() and ch.shm is not None:
        transport.release_slots(ch)


class Transport:
    """A client's sockets (one per thread, opened lazily per process) and requests over them.

    Args:
        address: normalized server address.
        server_key: the server's CURVE public key, or None.
        client_keys: this client's CURVE key pair (with ``server_key``).
        call_timeout: seconds calls that never block wait for their reply.
        liveness_s: as for :class:`~rlreplay.Client`.
        diagnose_s: seconds spent finding out why a call got no answer.
    """

    def __init__(
        self,
        address: str,
        server_key: bytes | None,
        client_keys: tuple[bytes, bytes] | None,
        call_timeout: float,
        liveness_s: float,
        diagnose_s: float = DIAGNOSE_S,
    ):
        self.address = address
        self.diagnose_s = diagnose_s
        self.server_key, self.client_keys = server_key, client_keys
        self.call_timeout = call_timeout
        self.liveness_s = liveness_s
        self._lock = threading.Lock()
        self._local = threading.local()
        self._channels: list[Channel] = []
        self._ids = itertools.count(1)
        self.shm: Any = None  # the client's SharedMemoryPath, if used
        self.waits = ReplyWaits(self)
        self.closed = False  # by close(): every later call raises ClosedError

    def connect(self) -> zmq.Socket:
        """A new DEALER socket connected to the server."""
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.setsockopt(zmq.RCVHWM, 1000)
        if self.server_key is not None:
            sock.curve_serverkey = self.server_key
            sock.curve_publickey, sock.curve_secretkey = self.client_keys
        if auth.is_ipv6(self.address):
            sock.setsockopt(zmq.IPV6, 1)
        sock.connect(self.address)
        return sock

    def check_open(self) -> None:
        """Raise :class:`~rlreplay.errors.ClosedError` once :meth:`close` was called."""
        if self.closed:
            raise ClosedError(
                f"this client of {self.address} was closed (close() or the end of its with "
                "block); create a new Client(address) to connect again"
            )

    def channel(self) -> Channel:
        """This thread's socket, opened on first use per process (ClosedError once closed)."""
        self.check_open()
        ch = getattr(self._local, "channel", None)
        if ch is None or ch.pid != os.getpid():
            ch = self._local.channel = Channel(self.connect)
            # Released when the thread ends, not when the client closes.
            self._local.end = end = _ThreadEnd()
            weakref.finalize(end, _thread_ended, weakref.ref(self), ch).atexit = False
            with self._lock:
                self._channels = [c for c in self._channels if c.pid == ch.pid] + [ch]
        return ch

    def next_id(self) -> int:
        """A new request id (unique among this client's requests)."""
        return next(self._ids)

    def release_slots(self, ch: Channel) -> None:
        """Release the shared-memory slots of ``ch``, whose thread ended."""
        # bounded: a garbage collection may run this in a thread holding the lock
        if not self._lock.acquire(timeout=1.0):
            return  # the server forgets the slots after IDLE_S unused
        try:
            if not any(c is ch for c in self._channels):
                return
            ring, ch.shm = ch.shm, None
        finally:
            self._lock.release()
        with contextlib.suppress(Exception):  # a finalizer must not raise
            ring.release()

    def close(self) -> None:
        """Close this process's sockets for good, telling the server to unmap their slots."""
        self.closed = True
        with self._lock:
            for ch in self._channels:
                if ch.pid == os.getpid():
                    ring, ch.shm = ch.shm, None
                    if ring is not None and ring.slots:
                        ring.release()
                        ch.sock.close(linger=DETACH_LINGER_MS)
                    else:
                        ch.sock.close(linger=0)
            self._channels = []
        self._local = threading.local()

    def until(self, timeout: Any) -> float | None:
        """``time.monotonic()`` at which a call with ``timeout`` gives up (None: never)."""
        if timeout is CALL:
            return time.monotonic() + self.call_timeout
        return None if timeout is None else time.monotonic() + timeout + REPLY_GRACE_S

    def send(
        self,
        header: dict,
        arrays: Mapping[str, np.ndarray] | None = None,
        *,
        until: Any = CALL,
        expires: float | None = None,
        timeout: Any = CALL,
        label: str | None = None,
    ) -> int:
        """Send a request without waiting for its reply (a socket's first request is preceded
        by a ping that learns the server's epoch); returns its id.

        Args:
            until: ``time.monotonic()`` by which it must be sent (None: no limit; default:
                ``call_timeout`` from now).
            expires: ``time.monotonic()`` after which the server must not start it.
            timeout: seconds the server may block it, cut to what is left before ``until``.
            label: the request's name in errors (default: its op).

        Raises:
            ServerUnavailableError: if not sent before ``until`` (then never sent later).
            InvalidArgumentError: if the request is larger than the server accepts.
        """
        if until is CALL:
            until = time.monotonic() + self.call_timeout
        ch = self.channel()
        op = header.get("op")
        ping = op == "ping"
        if not ping and not ch.greeted:
            self._greet(ch, until, op)
        if timeout is not CALL:
            if timeout is not None and until is not None:
                # the server gives up (and answers) before this client does
                timeout = max(min(timeout, until - REPLY_GRACE_S - time.monotonic()), 1e-6)
            header["timeout"] = timeout
        rid = self.next_id()
        header["id"] = rid
        if ch.epoch is not None and not ping:
            header["epoch"] = ch.epoch
        if expires is not None:
            # In the server's clock; a margin is left for the reply to travel back.
            margin = min(EXPIRY_MARGIN_S, max(expires - time.monotonic(), 0.0) / 4)
            header["expires"] = expires - margin + ch.clock_offset
        if ch.greeted:
            header["lease"] = lease = self.lease_of(ch)
            ch.latest_lease = max(ch.latest_lease, lease - ch.clock_offset)
        slot = None
        if arrays and self.shm is not None and (op == "insert" or op == "write"):
            # a same-host client's large arrays travel in its shared memory
            arrays, slot = self.shm.place(ch, header, arrays, until)
        frames = self._encoded(ch, header, arrays)
        sock = ch.sock
        try:
            framing.send(sock, frames)
        except zmq.Again:
            left = 2 * self.liveness_s if until is None else until - time.monotonic()
            if left <= 0 or not sock.poll(max(1, int(left * 1000)), zmq.POLLOUT):
                self._unavailable(
                    ch, f"could not send to {self.address} within {max(left, 0):.3g}s"
                )
            framing.send(sock, frames)
        if not header.get("noreply"):  # no reply comes: nothing to wait for or to fail
            ch.sent(rid, label or op)
        if slot is not None:
            self.shm.sent(ch, slot, rid)
        return rid

    def _encoded(self, ch: Channel, header: dict, arrays: Mapping | None) -> list:
        """The frames of a request, checked against the server's size limit once known."""
        frames = codec.encode(header, arrays)
        if arrays and ch.max_message_bytes is not None:
            self.check_size(frames, ch.max_message_bytes)
        return frames

    def _greet(self, ch: Channel, until: float | None, op: str) -> None:
        """The handshake before a socket's first request: a ping learns the epoch."""
        label = f"the handshake before {op}"
        for _ in range(2):
            try:
                self.wait_until(self.send({"op": "ping"}, until=until, label=label), until)
                break
            except ServerRestartedError:
                continue
        ch.greeted = True

    def lease_of(self, ch: Channel) -> float:
        """The ``lease`` a message on ``ch`` carries (see docs/protocol.md)."""
        since = ch.waiting_since
        base = time.monotonic() if since is None else max(ch.last_heard, since)
        margin = min(EXPIRY_MARGIN_S, self.liveness_s / 4)
        return base + 2 * self.liveness_s - margin + ch.clock_offset

    def check_size(self, frames: list, limit: int) -> None:
        size = codec.frames_nbytes(frames)
        if size > limit:
            raise InvalidArgumentError(
                f"this request is {size} bytes, more than the server at {self.address} accepts "
                f"(max_message_bytes={limit}); send fewer rows or steps per call"
            )

    def wait(self, rid: int, timeout: float | None) -> tuple[dict, dict]:
        """Wait up to ``timeout`` seconds for the reply to ``rid`` (see :meth:`wait_until`)."""
        return self.waits.wait_until(rid, None if timeout is None else time.monotonic() + timeout)

    def forget(self, rids: Any) -> None:
        """Drop the replies to ``rids`` (of this thread's channel) when they arrive."""
        self.channel().forget(rids)

    def cancel(self, rids: Any) -> None:
        """Give up on ``rids``, best effort: the server drops those still parked."""
        rids = [int(r) for r in rids]
        if rids:
            self.channel().forget(rids)
            self.notify({"op": "cancel", "rids": rids})

    def notify(self, header: dict) -> None:
        """Send ``header`` without a reply, best effort (failures are logged at debug)."""
        if self.closed:
            return
        try:
            self.send({**header, "noreply": True}, until=time.monotonic() + REPLY_GRACE_S)
        except ReplayError as error:
            logging.getLogger("rlreplay").debug("%s not sent: %s", header["op"], error)

    def wait_until(self, rid: int, until: float | None) -> tuple[dict, dict]:
        """Wait for the reply to ``rid``; raise its typed error if it failed."""
        return self.waits.wait_until(rid, until)

    def _unavailable(self, ch: Channel, message: str) -> None:
        """Drop the channel's socket and queued requests; raise ServerUnavailableError."""
        self.waits.unavailable(ch, message)

    def diagnose(self, timeout: float | None = None) -> str | None:
        """A :func:`~rlreplay.net.wire.auth.diagnose_connection` verdict for this client."""
        return self.waits.diagnose(timeout)

    def call(
        self,
        header: dict,
        arrays: Mapping[str, np.ndarray] | None = None,
        timeout: Any = CALL,
        until: Any = CALL,
    ) -> tuple[dict, dict]:
        """Send a request and wait for its reply.

        Args:
            timeout: seconds the server may block it, ``None`` (no limit) or ``CALL``.
            until: when the whole call gives up (default: from ``timeout``).
        """
        if until is CALL:
            until = self.until(timeout)
        rid = self.send(header, arrays, until=until, expires=until, timeout=timeout)
        return self.wait_until(rid, until)


class ReplyWaits:
    """The waits of one transport's calls."""

    def __init__(self, tr: Transport):
        self.tr = tr

    def wait_until(self, rid: int, until: float | None) -> tuple[dict, dict]:
        """Wait for the reply to ``rid``; raise its typed error if it failed.

        Args:
            until: ``time.monotonic()`` to give up at; ``None``: while the server answers pings.

        Raises:
            ServerUnavailableError: if the server did not answer by ``until`` (this call
                fails) or for ``2 * liveness_s`` (the socket's calls fail); none applied later.
            ServerRestartedError: if the server restarted since the request was sent.
            ReplayTimeoutError: if the server answers but this call did not complete.
        """
        start = time.monotonic()
        ch = self.tr.channel()
        ch.receive()  # a reply already here is taken, even past ``until``
        outer = ch.waiting_since
        ch.waiting_since = start if outer is None else outer
        try:
            return self._wait(ch, rid, until, start)
        finally:
            ch.waiting_since = outer

    def _wait(self, ch: Channel, rid: int, until: float | None, start: float) -> tuple[dict, dict]:
        """The loop of :meth:`wait_until`."""
        last_ping = ping_sent = -float("inf")
        ping_s = self.tr.liveness_s / 2
        warned = False
        verdict: Any = UNDIAGNOSED  # why the server is silent, once looked at
        while rid not in ch.replies:
            now = time.monotonic()
            silent = now - max(ch.last_heard, start)
            if not warned and silent >= UNANSWERED_WARN_S:
                warned = True
                verdict = self._warn_unanswered(ch, rid, now - start, silent, until)
            if until is not None and now >= until:
                waited = f"within {max(until - start, 0.0):.3g}s"
                if ch.last_heard > ping_sent:
                    ch.abandon(rid)
                    raise ReplayTimeoutError(
                        f"the replay server at {self.tr.address} answers, but this "
                        f"{ch.op_of(rid)} did not complete {waited}"
                    )
                self.no_answer(
                    ch,
                    rid,
                    f"no reply to {ch.op_of(rid)} from the replay server at "
                    f"{self.tr.address} {waited}",
                    verdict,
                )
            if until is None and silent >= 2 * self.tr.liveness_s:
                self.unavailable(
                    ch,
                    f"the replay server at {self.tr.address} stopped answering "
                    f"({silent:.3g}s without a reply to a ping)",
                )
            wait = ping_s
            if until is not None:
                if until - now <= REPLY_GRACE_S and ping_sent < start:
                    # the last ping tells a busy server from a dead one at the deadline
                    ping_sent = last_ping = now
                    ch.abandon(self.tr.send({"op": "ping"}, until=until))
                    if ch.last_heard < start and verdict is UNDIAGNOSED:
                        # look at why while the last ping is out
                        verdict = self.diagnose(min(self.tr.diagnose_s, REPLY_GRACE_S / 2))
                        now = time.monotonic()
                wait = min(wait, until - now - (REPLY_GRACE_S if ping_sent < start else 0.0))
            if not warned:
                wait = max(min(wait, max(ch.last_heard, start) + UNANSWERED_WARN_S - now), 0.0)
            if silent >= ping_s and now - last_ping >= ping_s:
                # Pings reveal a restarted server and renew this socket's lease in time.
                last_ping = now
                ch.abandon(self.tr.send({"op": "ping"}, until=until))
            if ch.wait(wait):
                ch.receive()
        header, arrays = ch.replies.pop(rid)
        if not header.get("ok"):
            raise codec.error_from_code(header.get("code"), str(header.get("message", "")))
        return header, arrays

    def _warn_unanswered(
        self, ch: Channel, rid: int, waited: float, silent: float, until: float | None
    ) -> Any:
        """Log once that call ``rid`` got no answer, and why; returns the verdict."""
        look = self.tr.diagnose_s
        if until is not None:
            look = min(look, max(until - time.monotonic(), 0.05))
        verdict = self.diagnose(look)
        if verdict == "ok":
            return verdict
        why = auth.unreachable_reason(verdict) or "the server is stalled, overloaded or down"
        left = (
            "without a deadline"
            if until is None
            else f"{max(until - time.monotonic(), 0.0):.3g}s more"
        )
        logging.getLogger("rlreplay").warning(
            "a call to the replay server at %s has waited %.3gs without a reply to %s "
            "(nothing heard from the server for %.3gs, not even to a ping): %s (it waits %s)",
            self.tr.address,
            waited,
            ch.op_of(rid),
            silent,
            why,
            left,
        )
        return verdict

    def no_answer(self, ch: Channel, rid: int, message: str, verdict: Any = None) -> None:
        """A wait with a deadline got no answer: only this call fails (raises
        ServerUnavailableError), or all of the socket's once its latest lease has passed."""
        if time.monotonic() >= ch.latest_lease:
            self.unavailable(ch, message, verdict)  # the server refuses all of them now
        # the next request pings first, to see a restarted server's new epoch
        ch.greeted = False
        ch.abandon(rid)
        raise self._diagnosed(message, verdict) from None

    def unavailable(self, ch: Channel, message: str, verdict: Any = None) -> None:
        """Drop the channel's socket and queued requests; raise ServerUnavailableError."""
        ch.reset(message)
        raise self._diagnosed(message, verdict) from None

    def _diagnosed(self, message: str, verdict: Any = None) -> ServerUnavailableError:
        """The ServerUnavailableError of a call that got no answer, with why where known."""
        if verdict is None or verdict is UNDIAGNOSED:
            verdict = self.diagnose()
        why = auth.unreachable_reason(verdict)
        if why is None:
            why = "server down, unreachable, or rejecting this client's credentials"
        return ServerUnavailableError(f"{message}: {why}", verdict)

    def diagnose(self, timeout: float | None = None) -> str | None:
        """A diagnosis verdict for this client's address and keys, or None."""
        timeout = self.tr.diagnose_s if timeout is None else timeout
        if timeout <= 0:
            return None
        try:
            return auth.diagnose_connection(
                self.tr.address, self.tr.server_key, self.tr.client_keys, timeout=timeout
            )
        except (zmq.ZMQError, InvalidArgumentError):
            return None
