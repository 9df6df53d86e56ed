"""How a :class:`~rlreplay.Server` answers: every reply stamped with the server's epoch and
clock, sent with ``NOBLOCK`` so one slow client never stalls the others.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from typing import Any

import zmq

from rlreplay.net.server.limits import ClientLedger
from rlreplay.net.wire import codec, framing

log = logging.getLogger("rlreplay.net")

# Sent before a parked call is served, only to see whether ZeroMQ can reach the client.
PROBE = codec.encode({"notice": "probe"})


class Replies:
    """The reply side of one server.

    Args:
        clients: the server's per-client ledger (bytes of large replies held per client).

    Attributes:
        sock: the server's ROUTER socket (set when it is bound).
        epoch: the server's epoch (set at each start), carried by every reply.
    """

    def __init__(self, clients: ClientLedger):
        self.clients = clients
        self.sock: Any = None
        self.epoch: int | None = None
        self._last_drop_log = -float("inf")

    def ok(self, identity: Any, rid: Any, header: dict, arrays: dict | None) -> None:
        """Answer request ``rid`` of ``identity`` with a result."""
        header["id"] = rid
        header["ok"] = True
        header["epoch"] = self.epoch
        header["now"] = time.monotonic()
        self.send(identity, codec.encode(header, arrays), rid)

    def error(self, identity: Any, rid: Any, exc: BaseException) -> None:
        """Answer request ``rid`` of ``identity`` with the typed error ``exc``."""
        header = {
            "id": rid,
            "ok": False,
            "code": codec.error_code(exc),
            "message": str(exc),
            "epoch": self.epoch,
            "now": time.monotonic(),
        }
        self.send(identity, codec.encode(header), rid)

    def reachable(self, identity: Any) -> bool | None:
        """Whether ``identity`` can get a reply now (None: its queue is full)."""
        try:
            framing.send(self.sock, PROBE, identity)
        except zmq.Again:
            return None
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                return False
            raise
        return True

    def notice(self, identity: Any, rid: Any, message: str) -> None:
        """Send ``identity`` a warning about its call ``rid``, never blocking."""
        header = {"notice": "blocked", "call": rid, "message": message}
        with contextlib.suppress(zmq.ZMQError):  # zmq.Again included
            framing.send(self.sock, codec.encode(header), identity)

    def send(self, identity: Any, frames: list, rid: Any = None) -> None:
        """Send the reply to request ``rid`` without blocking."""
        nbytes = 0
        if len(frames) > 1:
            nbytes = codec.frames_nbytes(frames)
        try:
            if nbytes < codec.ZERO_COPY_BYTES:
                framing.send(self.sock, frames, identity)
                return
            # the last frame leaves last: once released, the reply is sent
            frames[-1] = zmq.Frame(frames[-1], copy=False, track=True)
            tracker = self.sock.send_multipart([identity, *frames], zmq.NOBLOCK, copy=False)
            self.clients.sent(identity.bytes, tracker, nbytes)
        except zmq.Again:
            now = time.monotonic()
            if now - self._last_drop_log >= 10.0:
                self._last_drop_log = now
                log.warning("dropped a reply to a client that is not reading (queue full)")
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:  # its connection is gone: nobody to answer
                log.debug("no reply to request %r: its client's connection is gone", rid)
                return
            log.warning("could not reply to a client: %s", exc)
