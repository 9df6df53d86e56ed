"""One thread's client socket, the requests outstanding on it and the replies that arrived."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import time
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from rlreplay.errors import ProtocolError
from rlreplay.net import compact, framing, wire
from rlreplay.net.direct import DirectLink, LinkClosed, frames_of, spin_seconds

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_RESTARTED = wire.CODE_OF[wire.errors.ServerRestartedError]
_UNAVAILABLE = wire.CODE_OF[wire.errors.ServerUnavailableError]


class Channel:
    """One thread's DEALER socket; replies arrive on the socket that sent the request.

    Replies are kept by request id until the thread that waits for them takes them, so
    several requests may be in flight and answered in any order.

    The channel also knows which server it talks to: the *epoch* of the last reply (a
    number each server start draws) and the offset of the server's clock. Each outstanding
    request remembers the epoch it was sent under; when a reply shows another epoch the
    server restarted, and every request the old server had taken is failed at once with
    :class:`~rlreplay.errors.ServerRestartedError` (the new server never saw them, or
    refuses them).

    Beside its socket a channel may hold a *direct link* to a same-host server
    (:mod:`rlreplay.net.direct`): replies arrive on either, and are kept alike.

    Args:
        connect: opens a new connected socket (used again by :meth:`reset`).
    """

    def __init__(self, connect: Callable[[], zmq.Socket]):
        self._connect = connect
        self.pid = os.getpid()
        self.replies: dict[int, tuple[dict, dict]] = {}
        self.abandoned: set[int] = set()
        self.pending: dict[int, int | None] = {}  # request id -> epoch it was sent under
        self.epoch: int | None = None
        self.greeted = False  # a handshake ping was answered on this socket
        self.waiting_since: float | None = None  # when the wait under way began, if any
        self.max_message_bytes: int | None = None  # the server's limit, once known
        self.clock_offset = 0.0  # server clock minus this clock, a lower bound
        self.last_heard = time.monotonic()
        # The latest lease a message on this socket carried, in this process's clock:
        # once it has passed the server refuses whatever of them it had not started.
        self.latest_lease = -float("inf")
        self.inserts: Any = None  # the thread's InsertPipeline, once it inserts
        self.shm: Any = None  # the thread's shared-memory reply slots (rlreplay.net.shm)
        self.direct: DirectLink | None = None  # the direct link, once opened
        self.direct_wanted = True  # ask for a link at the next handshake
        self.direct_sent: set[int] = set()  # requests sent on the link, not answered
        self.direct_ready = False  # the last wait saw the link readable
        self.zmq_ready = True  # the last wait saw the ZeroMQ socket readable
        self._link_poller: Any = None  # polls the link alone
        self.spin_s = 0.0  # a wait on the link polls without sleeping this long first
        # The last request sent through ZeroMQ, until a reply to it (or to a later one)
        # shows the server took it: while set, requests keep to ZeroMQ (their order).
        self.zmq_tail: int | None = None
        self._open()

    def _open(self) -> None:
        self.sock = self._connect()
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)

    def sent(self, rid: int) -> None:
        """Note that request ``rid`` went out under the current epoch."""
        self.pending[rid] = self.epoch

    def abandon(self, rid: int) -> None:
        """Stop waiting for ``rid``: its reply is dropped when it arrives."""
        self.pending.pop(rid, None)
        if self.replies.pop(rid, None) is None:
            self.abandoned.add(rid)

    def attach_direct(self, link: DirectLink) -> None:
        """Use ``link`` for this thread's direct calls (its replies are polled too)."""
        self.direct = link
        self.poller.register(link.fd, zmq.POLLIN)
        self._link_poller = select.poll()
        self._link_poller.register(link.fd, select.POLLIN)
        self.spin_s = spin_seconds()

    def drop_direct(self) -> None:
        """Close the direct link; requests outstanding on it fail with
        ServerUnavailableError (the server stopped or was killed: it answers none of
        them), and the next request first learns the server's epoch again."""
        link, self.direct = self.direct, None
        if link is None:
            return
        with contextlib.suppress(KeyError):
            self.poller.unregister(link.fd)
        link.close()
        self.greeted = False
        if self.direct_sent:
            self.fail(
                self.direct_sent,
                _UNAVAILABLE,
                "the replay server closed its direct link while this call was outstanding "
                "(it stopped or was killed); the call may or may not have been applied, and "
                "will not be later",
            )
            self.direct_sent.clear()

    def has_message(self) -> bool:
        """Whether a reply waits to be received (no wait)."""
        return bool(self.sock.getsockopt(_EVENTS) & _POLLIN)

    def receive(self, zmq_ready: bool = True) -> None:
        """Move every waiting reply into ``replies`` (dropping abandoned ones).

        Args:
            zmq_ready: False if a :meth:`wait` just saw no message on the ZeroMQ socket
                (its check is then skipped).
        """
        if self.direct_ready or self.direct_sent:
            self.direct_ready = False
            self._receive_direct()
            if not zmq_ready:
                return
        sock = self.sock
        # EVENTS tells whether a message waits, far cheaper than the exception that a
        # non-blocking receive raises when none does.
        while sock.getsockopt(_EVENTS) & _POLLIN:
            frames = framing.receive(sock)
            now = self.last_heard = time.monotonic()
            header, arrays = wire.decode(frames)
            rid = header.get("id")
            tail = self.zmq_tail
            if tail is not None and type(rid) is int and rid >= tail:
                self.zmq_tail = None  # the server took every request sent through ZeroMQ
            self._keep(header, arrays, rid, now)

    def _receive_direct(self) -> None:
        """Take the next reply waiting on the direct link (drop it if the server closed
        it). One per call: a link carries one awaited call at a time, and a reply left
        (to a call that gave up) is taken by the next wait, whose poll finds it."""
        link = self.direct
        if link is None:
            return
        try:
            data = link.receive()
        except LinkClosed:
            self.drop_direct()
            return
        if data is None:
            return
        if compact.is_reply(data):
            header, arrays = compact.decode_reply(data), {}
        else:
            frames = frames_of(data)
            if frames is None:
                raise ProtocolError("a malformed message arrived on the direct link")
            header, arrays = wire.decode(frames)
        now = self.last_heard = time.monotonic()
        rid = header.get("id")
        self.direct_sent.discard(rid)
        if header.get("moved"):
            return  # the reply, too large for the link, comes through ZeroMQ
        self._keep(header, arrays, rid, now)

    def _keep(self, header: dict, arrays: dict, rid: Any, now: float) -> None:
        """Keep a reply for its waiter (or drop it, abandoned); a server's notice is no
        reply (see :func:`notice`)."""
        if "notice" in header:
            notice(header)
            return
        self._observe(header, now)
        self.pending.pop(rid, None)
        if rid in self.abandoned:
            self.abandoned.discard(rid)
        else:
            self.replies[rid] = (header, arrays)

    def _observe(self, header: dict, now: float) -> None:
        """Track the server's epoch and clock from a reply's header."""
        limit = header.get("max_message_bytes")
        if isinstance(limit, int):
            self.max_message_bytes = limit
        epoch = header.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            return  # a server that does not send epochs: nothing to compare
        server_now = header.get("now")
        if isinstance(server_now, float):
            # The server stamped the reply between our send and now, so this underestimates
            # the offset (never over): deadlines converted with it err on the early side.
            self.clock_offset = server_now - now
        if epoch == self.epoch:
            return
        if self.epoch is not None:
            message = (
                f"the replay server restarted (epoch {self.epoch} -> {epoch}) while this call "
                "was outstanding; the new server did not apply it"
            )
            self.fail([r for r, e in self.pending.items() if e != epoch], _RESTARTED, message)
        self.epoch = epoch

    def fail(self, rids: Iterable[int], code: int, message: str) -> None:
        """Answer ``rids`` locally with the error ``code`` (their server replies are dropped)."""
        for rid in list(rids):
            self.pending.pop(rid, None)
            if rid in self.abandoned:
                self.abandoned.discard(rid)
            else:
                self.replies[rid] = ({"id": rid, "ok": False, "code": code, "message": message}, {})
            # a late reply from the server must not overwrite the local answer
            self.abandoned.add(rid)

    def reset(self, message: str) -> None:
        """Drop the socket (and every message still queued in it), fail every outstanding
        request with ServerUnavailableError, and open a fresh socket.

        A request still queued when its call gave up would otherwise reach the server
        later, after the caller was told it failed. Replies that already arrived are kept
        first (e.g. acknowledgements of pipelined inserts nobody waited for yet).
        """
        with contextlib.suppress(Exception):  # a malformed reply must not stop the reset
            self.receive()
        self.fail(list(self.pending), _UNAVAILABLE, message)
        self.abandoned.clear()
        self.direct_sent.clear()
        self.drop_direct()
        self.zmq_tail = None
        self.sock.close(linger=0)
        self.epoch = None  # learnt again (by a handshake) before the next request
        self.greeted = False
        self.latest_lease = -float("inf")
        self._open()

    def wait(self, seconds: float, link_only: bool = False) -> bool:
        """Wait up to ``seconds`` (at least 1 ms) for a message; True if one arrived
        (``zmq_ready`` says whether on the ZeroMQ socket). With ``link_only``, only the
        direct link is watched (a third of the cost of polling both), without sleeping
        for its first ``spin_s``."""
        ms = max(1, int(seconds * 1000))
        if link_only and self.direct is not None:
            self.zmq_ready = False
            poll = self._link_poller.poll
            if self.spin_s:  # poll without sleeping for a while first (spin_seconds)
                end = time.perf_counter() + self.spin_s
                while not poll(0):
                    if time.perf_counter() >= end:
                        break
                else:
                    self.direct_ready = True
                    return True
            self.direct_ready = bool(poll(ms))
            return self.direct_ready
        events = self.poller.poll(ms)
        if self.direct is None or not events:
            self.zmq_ready = bool(events)
            return self.zmq_ready
        # the link has a message, or was closed
        self.zmq_ready = events[0][0] is self.sock
        self.direct_ready = len(events) > 1 or not self.zmq_ready
        return True

    def forget(self, rids: Iterable[int]) -> None:
        """Drop replies to ``rids`` now or when they arrive."""
        for rid in rids:
            self.abandon(rid)


def notice(header: dict) -> None:
    """A message the server sent on its own, about a call of this client: a probe before
    a parked call is served (nothing to do), or a ``message`` to log in this process (a
    call blocked on a rate limiter for the table's ``warn_after``: the warning the server
    logs, with its cause)."""
    message = header.get("message")
    if isinstance(message, str):
        logging.getLogger("rlreplay").warning("%s", message)
