"""One thread's client socket, the requests outstanding on it and the replies that arrived."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from rlreplay.net.wire import codec, framing

# Replies whose clock readings give the offset to the server's clock (the largest wins).
OFFSET_WINDOW = 16

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_RESTARTED = codec.CODE_OF[codec.errors.ServerRestartedError]
_UNAVAILABLE = codec.CODE_OF[codec.errors.ServerUnavailableError]


class Channel:
    """One thread's DEALER socket; replies arrive on the socket that sent the request.

    Replies are kept by request id until their waiter takes them, so requests may be
    answered in any order. A reply with a new server epoch fails every request the old
    server had taken (:class:`~rlreplay.errors.ServerRestartedError`).

    Args:
        connect: opens a new connected socket (used again by :meth:`reset`).
    """

    def __init__(self, connect: Callable[[], zmq.Socket]):
        self._connect = connect
        self.pid = os.getpid()
        self.replies: dict[int, tuple[dict, dict]] = {}
        self.abandoned: set[int] = set()
        # request id -> (epoch it was sent under, its op: named by the errors of its wait)
        self.pending: dict[int, tuple[int | None, str]] = {}
        self.epoch: int | None = None
        self.greeted = False  # a handshake ping was answered on this socket
        self.waiting_since: float | None = None  # when the wait under way began, if any
        self.max_message_bytes: int | None = None  # the server's limit, once known
        self.clock_offset = 0.0  # server clock minus this clock, a lower bound
        self._offsets: deque[float] = deque(maxlen=OFFSET_WINDOW)  # this epoch's latest
        self.last_heard = time.monotonic()
        # the latest lease sent, in this clock: past it the server refuses what it had not started
        self.latest_lease = -float("inf")
        self.shm: Any = None  # the thread's shared-memory reply slots (rlreplay.net.client.shm)
        self._open()

    def _open(self) -> None:
        self.sock = self._connect()
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)

    def sent(self, rid: int, op: str) -> None:
        """Note that request ``rid`` (operation ``op``) went out under the current epoch."""
        self.pending[rid] = (self.epoch, op)

    def op_of(self, rid: int) -> str:
        """The operation of outstanding request ``rid`` (``"call"`` once it is not)."""
        return self.pending.get(rid, (None, "call"))[1]

    def abandon(self, rid: int) -> None:
        """Stop waiting for ``rid``: its reply is dropped when it arrives."""
        self.pending.pop(rid, None)
        if self.replies.pop(rid, None) is None:
            self.abandoned.add(rid)

    def receive(self) -> None:
        """Move every waiting reply into ``replies`` (dropping abandoned ones)."""
        sock = self.sock
        # EVENTS is cheaper than the exception of an empty non-blocking receive
        while sock.getsockopt(_EVENTS) & _POLLIN:
            frames = framing.receive(sock)
            now = self.last_heard = time.monotonic()
            header, arrays = codec.decode(frames)
            self._keep(header, arrays, header.get("id"), now)

    def _keep(self, header: dict, arrays: dict, rid: Any, now: float) -> None:
        """Keep a reply for its waiter (or drop it, abandoned); a notice is no reply."""
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
        if epoch != self.epoch:
            self._offsets.clear()  # another server's clock
        server_now = header.get("now")
        if isinstance(server_now, float):
            # Each reply gives a lower bound of the offset, so converted deadlines err early.
            self._offsets.append(server_now - now)
            self.clock_offset = max(self._offsets)
        if epoch == self.epoch:
            return
        if self.epoch is not None:
            message = (
                f"the replay server restarted (epoch {self.epoch} -> {epoch}) while this call "
                "was outstanding; the new server did not apply it"
            )
            self.fail([r for r, (e, _) in self.pending.items() if e != epoch], _RESTARTED, message)
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
        """Drop the socket with everything queued in it (so no request reaches the server
        after its call failed), fail every outstanding request with ServerUnavailableError,
        and open a fresh socket. Replies already arrived are kept.
        """
        with contextlib.suppress(Exception):  # a malformed reply must not stop the reset
            self.receive()
        self.fail(list(self.pending), _UNAVAILABLE, message)
        self.abandoned.clear()
        self.sock.close(linger=0)
        self.epoch = None  # learnt again (by a handshake) before the next request
        self.greeted = False
        self.latest_lease = -float("inf")
        self._open()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` (at least 1 ms) for a message; True if one arrived."""
        return bool(self.poller.poll(max(1, int(seconds * 1000))))

    def forget(self, rids: Iterable[int]) -> None:
        """Drop replies to ``rids`` now or when they arrive."""
        for rid in rids:
            self.abandon(rid)


def notice(header: dict) -> None:
    """A message the server sent about a call: a probe (ignored) or a warning to log."""
    message = header.get("message")
    if isinstance(message, str):
        logging.getLogger("rlreplay").warning("%s", message)
