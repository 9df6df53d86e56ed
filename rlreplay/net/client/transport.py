"""How a client's requests travel: one socket per thread, server epochs, deadlines.

A :class:`Transport` sends requests and waits for their replies on behalf of a
:class:`~rlreplay.Client`. It keeps the guarantees the protocol makes under faults
(``docs/protocol.md``):

- a call's ``timeout`` bounds all of it: the handshake that learns the server's epoch, the
  send (a full queue), the wait, and the pings that tell a busy server from a dead one;
- every request carries the server epoch it is meant for and the time its caller stops
  waiting, so a restarted server refuses it and no server starts it after that time;
- a call with a deadline that gets no answer fails alone (its ``expires`` keeps any server
  from starting it later); when a call without one hears nothing for ``2 * liveness_s``,
  the thread's socket is dropped with everything still queued in it, after the lease past
  which the server refuses those requests, so a call that raised is never applied later;
- a reply with a new epoch fails every request the old server had taken
  (:class:`~rlreplay.errors.ServerRestartedError`).
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

# After a call got no answer at all, the client spends at most this long finding out why
# (nothing listening, a refused CURVE handshake):
# :func:`rlreplay.net.wire.auth.diagnose_connection`.
DIAGNOSE_S = 0.25

# A call still unanswered after this long on a socket the server never answered looks at
# why (as above) and, when it can tell (nothing listening, a refused credential), logs it
# once while it goes on waiting: a wait for a server that is not there is never silent.
UNANSWERED_WARN_S = 3.0

# Extra seconds a client waits past a call's timeout for the server's own timeout reply.
REPLY_GRACE_S = 0.5
UNDIAGNOSED = object()  # a wait has not looked at why its server is silent
# The server must not start a request later than this before its client gives up (or a
# quarter of the time left, if less), leaving the reply time to arrive.
EXPIRY_MARGIN_S = 0.25


class _CallTimeout:
    """``timeout`` of calls that never block: they wait ``call_timeout``."""

    def __repr__(self) -> str:
        return "CALL"


CALL: Any = _CallTimeout()


class Sender(Protocol):
    """What a client's writers and iterators send their requests through (a
    :class:`Transport`): requests sent, replies awaited or forgotten."""

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


# Milliseconds a closed socket may take to deliver its last shm_detach (in ZeroMQ's
# background thread: closing does not wait).
DETACH_LINGER_MS = 200


class _ThreadEnd:
    """Kept in a thread's locals beside its channel: collected when the thread ends."""


def _thread_ended(ref: weakref.ref, ch: Channel) -> None:
    """A thread that used ``ch`` ended: release its shared-memory slots (unless its
    client closed meanwhile, or this is a forked child that must not use the socket)."""
    transport = ref()
    if transport is not None and ch.pid == os.getpid() and ch.shm is not None:
        transport.release_slots(ch)


class Transport:
    """A client's sockets (one per thread, opened lazily in each process) and the
    request/reply exchange over them.

    Args:
        address: normalized server address.
        server_key: the server's CURVE public key, or None.
        client_keys: this client's CURVE key pair (with ``server_key``).
        call_timeout: seconds calls that never block wait for their reply.
        liveness_s: a call without a timeout declares the server unavailable after twice
            this many seconds without a reply; a waiting call pings after half as many.
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
        self.shm: Any = None  # the client's shared-memory path (rlreplay.net.client.shm), if used
        self.waits = ReplyWaits(self)
        self.closed = False  # by close(): every later call raises ClosedError

    # -------------------------------------------------------------- socket
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
        """This thread's socket and reply bookkeeping (opened on first use per process).

        Raises:
            ClosedError: once :meth:`close` was called (every call of the client comes
                here for its socket, so none goes on after it).
        """
        self.check_open()
        ch = getattr(self._local, "channel", None)
        if ch is None or ch.pid != os.getpid():
            ch = self._local.channel = Channel(self.connect)
            # Dropped with the thread's locals when the thread ends: its shared-memory
            # slots are released then, not when the client closes.
            self._local.end = end = _ThreadEnd()
            weakref.finalize(end, _thread_ended, weakref.ref(self), ch).atexit = False
            with self._lock:
                self._channels = [c for c in self._channels if c.pid == ch.pid] + [ch]
        return ch

    def next_id(self) -> int:
        """A new request id (unique among this client's requests)."""
        return next(self._ids)

    def release_slots(self, ch: Channel) -> None:
        """Release the shared-memory slots of ``ch``, whose thread ended (unless this
        transport closed meanwhile)."""
        # bounded: a collection may run this in a thread that holds the lock
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
        """Close this process's sockets for good (a later call raises ClosedError),
        telling the server to unmap their shared-memory slots without waiting for it (the
        message gets ``DETACH_LINGER_MS`` to leave)."""
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

    # ------------------------------------------------------------- messaging
    def until(self, timeout: Any) -> float | None:
        """When a call with ``timeout`` gives up: ``CALL`` (``call_timeout``) or seconds
        the server may block it (plus ``REPLY_GRACE_S``), as a ``time.monotonic()`` value;
        None (no timeout) waits as long as the server answers pings."""
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
        """Send a request without waiting for its reply; returns its id.

        Before the first request on a socket, a ping learns the server's epoch, its clock
        and its message size limit. Each request is stamped with the epoch, so a
        restarted server refuses requests meant for its predecessor.

        Args:
            until: ``time.monotonic()`` by which the request must be on its way (the
                handshake and a full send queue included); None: as long as the server
                answers pings; default: ``call_timeout`` from now.
            expires: ``time.monotonic()`` after which the server must not start the
                request (this client stops waiting for it then); None: no such limit.
            timeout: seconds the server may block the request, sent as ``"timeout"``,
                shortened to what is left before ``until`` (default: the header's own).
            label: what the errors of its wait call the request (default: its op).

        Raises:
            ServerUnavailableError: if the server did not answer the handshake or take the
                request before ``until`` (the request is then dropped, never sent later).
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
            # In the server's clock, early by at most a round trip; a margin (at most a
            # quarter of the time left) is left for the reply to travel back.
            margin = min(EXPIRY_MARGIN_S, max(expires - time.monotonic(), 0.0) / 4)
            header["expires"] = expires - margin + ch.clock_offset
        if ch.greeted:
            header["lease"] = lease = self.lease_of(ch)
            ch.latest_lease = max(ch.latest_lease, lease - ch.clock_offset)
        slot = None
        if arrays and self.shm is not None and (op == "insert" or op == "write"):
            # large arrays of a same-host client travel in its shared memory
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
        """The frames of a request, checked against the server's size limit once known.

        Raises:
            InvalidArgumentError: if the request is larger than the server accepts.
        """
        frames = codec.encode(header, arrays)
        if arrays and ch.max_message_bytes is not None:
            self.check_size(frames, ch.max_message_bytes)
        return frames

    def _greet(self, ch: Channel, until: float | None, op: str) -> None:
        """The handshake before a socket's first request (an ``op``): a ping learns the
        server's epoch (a reply with a new epoch fails what the old server took, this ping
        included: then once more)."""
        label = f"the handshake before {op}"
        for _ in range(2):
            try:
                self.wait_until(self.send({"op": "ping"}, until=until, label=label), until)
                break
            except ServerRestartedError:
                continue
        ch.greeted = True

    def lease_of(self, ch: Channel) -> float:
        """The ``lease`` a message on ``ch`` carries: a time (in the server's clock, as
        ``ch`` underestimates it, so early) before which no wait without a deadline on
        ``ch`` can declare the server unavailable. Such a wait gives up after
        ``2 * liveness_s`` without a reply, counted from its start or its last reply, so a
        message sent outside a wait gives ``now + 2 * liveness_s`` (later waits start
        later), and a ping inside a wait ``max(last reply, start) + 2 * liveness_s``,
        both less a margin. The server never applies a call parked without a timeout past
        the latest lease of its socket (the socket may have been dropped, the call
        reported failed).
        """
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
        """Give up on the requests ``rids`` (of this thread's channel): their replies are
        dropped, and the server drops those it still has parked, unanswered, so that a
        sample nobody waits for draws no item (a queue's, taken once). Best effort: the
        cancel message is sent without a reply within the reply grace; a server that does
        not get it drops the calls when their deadline or lease ends."""
        rids = [int(r) for r in rids]
        if rids:
            self.channel().forget(rids)
            self.notify({"op": "cancel", "rids": rids})

    def notify(self, header: dict) -> None:
        """Send ``header`` without a reply, best effort: nothing when this transport is
        closed, and a connection that must first greet its server again gives it the reply
        grace, no more; a message that could not be sent is logged (debug), not raised."""
        if self.closed:
            return
        try:
            self.send({**header, "noreply": True}, until=time.monotonic() + REPLY_GRACE_S)
        except ReplayError as error:
            logging.getLogger("rlreplay").debug("%s not sent: %s", header["op"], error)

    def wait_until(self, rid: int, until: float | None) -> tuple[dict, dict]:
        """Wait for the reply to ``rid``; raise its typed error if it failed (see
        :meth:`ReplyWaits.wait_until`)."""
        return self.waits.wait_until(rid, until)

    def _unavailable(self, ch: Channel, message: str) -> None:
        """Drop the channel's socket and queued requests; raise ServerUnavailableError."""
        self.waits.unavailable(ch, message)

    def diagnose(self, timeout: float | None = None) -> str | None:
        """A :func:`~rlreplay.net.wire.auth.diagnose_connection` verdict for this client's
        address and keys (see :meth:`ReplyWaits.diagnose`)."""
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
            timeout: seconds the server may block the call (a rate limiter), ``None`` for
                no limit, or ``CALL`` for calls that never block (they wait
                ``call_timeout``).
            until: when the whole call gives up (default: from ``timeout``), so that work
                done before sending (a handshake, a description) counts against it too.
        """
        if until is CALL:
            until = self.until(timeout)
        rid = self.send(header, arrays, until=until, expires=until, timeout=timeout)
        return self.wait_until(rid, until)


class ReplyWaits:
    """The waits of one transport's calls.

    Args:
        tr: the transport whose channels, address, keys and ``liveness_s`` it uses.
    """

    def __init__(self, tr: Transport):
        self.tr = tr

    def wait_until(self, rid: int, until: float | None) -> tuple[dict, dict]:
        """Wait for the reply to ``rid``; raise its typed error if it failed.

        Args:
            until: ``time.monotonic()`` to give up at; ``None`` waits as long as the server
                answers pings. A ping goes out ``REPLY_GRACE_S`` before a bounded wait
                ends, to tell a live but busy server (ReplayTimeoutError) from a dead one.

        Raises:
            ServerUnavailableError: if the server did not answer at all. By ``until``:
                this call fails alone (see :meth:`no_answer`); without a deadline, after
                ``2 * liveness_s`` of silence, the socket is dropped with everything still
                queued in it and every other request outstanding on it fails the same way.
                Either way none of them is applied later.
            ServerRestartedError: if the server restarted since the request was sent.
            ReplayTimeoutError: if the server answers but this call did not complete (its
                reply is dropped when it comes).
        """
        start = time.monotonic()
        ch = self.tr.channel()
        ch.receive()  # a reply already here is taken, even past ``until`` (waits in turn)
        outer = ch.waiting_since
        ch.waiting_since = start if outer is None else outer
        try:
            return self._wait(ch, rid, until, start)
        finally:
            ch.waiting_since = outer

    def _wait(self, ch: Channel, rid: int, until: float | None, start: float) -> tuple[dict, dict]:
        """The loop of :meth:`wait_until` (``ch.waiting_since`` set)."""
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
                        # why a silent server may not answer, looked at while its last
                        # ping is out: an error at the deadline says it without a wait
                        verdict = self.diagnose(min(self.tr.diagnose_s, REPLY_GRACE_S / 2))
                        now = time.monotonic()
                wait = min(wait, until - now - (REPLY_GRACE_S if ping_sent < start else 0.0))
            if not warned:
                wait = max(min(wait, max(ch.last_heard, start) + UNANSWERED_WARN_S - now), 0.0)
            if silent >= ping_s and now - last_ping >= ping_s:
                # Pings while waiting also reveal a restarted server (its epoch), and renew
                # this socket's lease (see lease_of): every half liveness_s, so that the
                # next lease reaches the server before the last one ends.
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
        """Log that call ``rid`` has waited ``waited`` seconds while its server answered
        nothing, not even a ping, for ``silent`` seconds, and why where a look at a new
        connection tells (nothing listening, a refused credential); returns that look's
        verdict. Nothing is logged when a new connection is answered (the server is up and
        busy). The look ends by ``until``."""
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
        """A wait with a deadline ended without an answer, not even to its last ping.

        Once the latest lease this socket sent has passed, the server refuses whatever of
        its requests it had not started, so the socket is dropped and all of them fail
        (:meth:`unavailable`). Before that, only this call fails: its request carries
        ``expires``, so no server starts it later, while the socket may carry requests
        without a deadline (a remote writer's chunks, say) that a stalled server could still
        apply when it resumes, and must not be reported failed. The next request first
        learns the server's epoch again. (What leases cover: ``docs/protocol.md``.)

        Raises:
            ServerUnavailableError: with why where it can tell (as :meth:`unavailable`).
        """
        if time.monotonic() >= ch.latest_lease:
            self.unavailable(ch, message, verdict)  # the server refuses all of them now
        # The next request first pings: a server that restarted meanwhile shows its new
        # epoch (failing what the old one had taken) before that request is stamped.
        ch.greeted = False
        ch.abandon(rid)
        raise self._diagnosed(message, verdict) from None

    def unavailable(self, ch: Channel, message: str, verdict: Any = None) -> None:
        """Drop the channel's socket and queued requests; raise ServerUnavailableError.

        The socket is dropped first, so nothing it queued can reach a server that comes
        back; then :meth:`_diagnosed` says why the server did not answer.
        """
        ch.reset(message)
        raise self._diagnosed(message, verdict) from None

    def _diagnosed(self, message: str, verdict: Any = None) -> ServerUnavailableError:
        """The ServerUnavailableError of a call that got no answer: ``message`` and why,
        where a short look at a new connection's handshake (at most ``diagnose_s``, or
        ``verdict`` when the wait has looked already) can tell: nothing accepts
        connections at the address, or which CURVE credential the server refused (also
        the error's ``reason``)."""
        if verdict is None or verdict is UNDIAGNOSED:
            verdict = self.diagnose()
        why = auth.unreachable_reason(verdict)
        if why is None:
            why = "server down, unreachable, or rejecting this client's credentials"
        return ServerUnavailableError(f"{message}: {why}", verdict)

    def diagnose(self, timeout: float | None = None) -> str | None:
        """A :func:`~rlreplay.net.wire.auth.diagnose_connection` verdict for this client's address
        and keys (watched for ``timeout``, default ``diagnose_s``), or None if the diagnosis
        was skipped or itself failed. Only run after a call failed."""
        timeout = self.tr.diagnose_s if timeout is None else timeout
        if timeout <= 0:
            return None
        try:
            return auth.diagnose_connection(
                self.tr.address, self.tr.server_key, self.tr.client_keys, timeout=timeout
            )
        except (zmq.ZMQError, InvalidArgumentError):
            return None
