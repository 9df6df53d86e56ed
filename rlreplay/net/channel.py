"""One thread's client socket and the replies that arrived on it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import zmq

from rlreplay.net import wire

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


class Channel:
    """One thread's DEALER socket; replies arrive on the socket that sent the request.

    Replies are kept by request id until the thread that waits for them takes them, so
    several requests may be in flight and answered in any order.
    """

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.poller = zmq.Poller()
        self.poller.register(sock, zmq.POLLIN)
        self.pid = os.getpid()
        self.replies: dict[int, tuple[dict, dict]] = {}
        self.abandoned: set[int] = set()
        self.last_heard = time.monotonic()

    def receive(self) -> None:
        """Move every waiting reply into ``replies`` (dropping abandoned ones)."""
        sock = self.sock
        # EVENTS tells whether a message waits, far cheaper than the exception that a
        # non-blocking receive raises when none does.
        while sock.getsockopt(_EVENTS) & _POLLIN:
            frames = sock.recv_multipart(copy=False)
            self.last_heard = time.monotonic()
            header, arrays = wire.decode(frames)
            rid = header.get("id")
            if rid in self.abandoned:
                self.abandoned.discard(rid)
            else:
                self.replies[rid] = (header, arrays)

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` (at least 1 ms) for a message; True if one arrived."""
        return bool(self.poller.poll(max(1, int(seconds * 1000))))

    def forget(self, rids: Iterable[int]) -> None:
        """Drop replies to ``rids`` now or when they arrive."""
        for rid in rids:
            if self.replies.pop(rid, None) is None:
                self.abandoned.add(rid)
