"""Direct calls: small awaited requests of a same-host client over a Unix socket.

An awaited call over ZeroMQ crosses four threads (the client's, its ZeroMQ I/O thread, the
server's I/O thread and its dispatcher) and back. A bare pyzmq echo makes 31k-34k round
trips/s here, a Python client on an ``AF_UNIX`` ``SOCK_SEQPACKET`` socket that the
server's dispatcher polls beside its ZeroMQ socket 118k-143k (same run, same server
loop; ``docs/net_benchmarks.md``). So a client on the server's host sends its small
awaited calls (:data:`DIRECT_OPS`: ``update_priorities``, ``delete``, ``info``,
``can_insert``, ``can_sample``, ``reset``) over such a socket, a *direct link*, and
everything else over ZeroMQ, with the same messages and the same server semantics:

- **Negotiated over the session.** The handshake ping of a thread's ZeroMQ socket asks
  for a link (``"direct": true``); the server answers with the name of its listening
  socket (in Linux's abstract namespace: no file, nothing left behind by a killed server)
  and a one-time token bound to that ZeroMQ connection. The client connects and sends the
  token; the server checks it and that the peer runs as the server's own user
  (``SO_PEERCRED``), then acknowledges. Requests on the link count as that connection's
  (its leases, its limits). Any failure leaves the thread on ZeroMQ.
- **Order.** A thread's requests reach the server in the order it sent them, as on one
  socket: a request takes the link only while every message this thread sent through
  ZeroMQ is known handled (a reply to it or to a later one arrived), and only awaited
  calls take it, so nothing sent through the link is outstanding when the thread next
  uses ZeroMQ (a request whose call gave up carries ``expires``: no server starts it
  later; one whose call was interrupted in its wait is waited for first:
  :meth:`~rlreplay.net.waits.ReplyWaits.settle_link`).
- **Faults.** Every request keeps its epoch stamp, ``expires`` and lease, and is awaited
  by the same loop as any other (pings over ZeroMQ, deadlines, typed errors). A link the
  server closed (it stopped, or was killed) fails the calls outstanding on it at once
  with :class:`~rlreplay.errors.ServerUnavailableError`; a request that finds the link
  closed before it was sent takes ZeroMQ instead (so a restarted server refuses it as
  addressed to its predecessor, :class:`~rlreplay.errors.ServerRestartedError`). A client
  killed with ``kill -9`` leaves nothing: the kernel closes its end, and the server drops
  the link.
- **Size.** A message on the link is at most :data:`DIRECT_MAX_BYTES`; a larger request
  takes ZeroMQ, and a larger reply comes back through ZeroMQ.
- **Compact messages.** A learner's awaited ``update_priorities`` and ``delete`` travel
  in fixed binary layouts (:mod:`rlreplay.net.compact`), served by the same handler.
- **Waiting.** A wait for a reply on the link polls it without sleeping for
  :func:`spin_seconds` before it blocks.

Off switches: ``Client(direct_calls=False)`` and ``Server(direct_calls=False)``. Used by
default where the client's shared-memory path is (``ipc://`` and loopback addresses) on
platforms with ``AF_UNIX`` ``SOCK_SEQPACKET`` sockets (Linux). The server's half lives in
:mod:`rlreplay.net.direct_server`.
"""

from __future__ import annotations

import errno
import functools
import os
import select
import socket
import struct
import time
import weakref
from collections.abc import Sequence
from typing import Any

from rlreplay.core.cpus import cpus
from rlreplay.errors import InvalidArgumentError

# Calls that may take a direct link: awaited, small requests whose replies are small.
DIRECT_OPS = frozenset({"update_priorities", "delete", "info", "can_insert", "can_sample", "reset"})
# Largest message on a link (the header's length prefix included). Seqpacket messages are
# bounded by the socket's send buffer (about 208 KiB by default on Linux).
DIRECT_MAX_BYTES = 65536
TOKEN_BYTES = 16
ACCEPTED = b"ok"
# Seconds a client waits for the server to accept its token (bounded also by its call).
OPEN_TIMEOUT_S = 1.0
_PREFIX = struct.Struct("<I")  # the header's length, before the header
# Microseconds a thread waiting for its reply on a link polls it without sleeping, before
# it blocks (see spin_seconds); RLREPLAY_DIRECT_SPIN_US sets another, 0 turns it off.
SPIN_US = 50
SPIN_VARIABLE = "RLREPLAY_DIRECT_SPIN_US"


def supported() -> bool:
    """Whether this platform has ``AF_UNIX`` ``SOCK_SEQPACKET`` sockets with peer
    credentials (Linux)."""
    return (
        hasattr(socket, "AF_UNIX")
        and hasattr(socket, "SOCK_SEQPACKET")
        and hasattr(socket, "SO_PEERCRED")
    )


@functools.cache
def spin_seconds() -> float:
    """Seconds a wait for a reply on a direct link polls without sleeping before it blocks.

    A same-host server answers a small call in tens of microseconds; a thread asleep in
    ``poll`` is woken by an interrupt to its CPU, which the server's send pays for (on a
    virtual machine, an exit to the hypervisor): 10-15 us of a 40-50 us awaited
    ``update_priorities`` on this project's 2-core test machine, twice a call. A waiter that
    polls without sleeping for a short while skips that (``docs/net_benchmarks.md``).
    :data:`SPIN_US`, or ``RLREPLAY_DIRECT_SPIN_US``; 0 where the process may run on one CPU
    only (the server would wait for the polling thread). Read once per process.

    Raises:
        InvalidArgumentError: if ``RLREPLAY_DIRECT_SPIN_US`` is not a whole number of
            microseconds in [0, 10000].
    """
    text = os.environ.get(SPIN_VARIABLE, "")
    us = SPIN_US
    if text:
        if not text.isdigit() or int(text) > 10_000:
            raise InvalidArgumentError(
                f"{SPIN_VARIABLE}={text!r} must be a whole number of microseconds in "
                f"[0, 10000] (0: a wait on a direct link sleeps at once); unset it for "
                f"the default {SPIN_US}"
            )
        us = int(text)
    if us and cpus() < 2:
        return 0.0
    return us * 1e-6


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of a connected Unix socket (for a
    client's end, the server process that listens)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def message(frames: Sequence[Any]) -> list | None:
    """The buffers of one link message for ``frames`` (from :func:`rlreplay.net.wire.encode`:
    a header, at most one packed frame), or None if it does not fit :data:`DIRECT_MAX_BYTES`
    or has more frames (a large array)."""
    if len(frames) > 2:
        return None
    header = frames[0]
    size = _PREFIX.size + len(header)
    if len(frames) == 2:
        body = frames[1]
        size += body.nbytes if type(body) is not bytes else len(body)
    if size > DIRECT_MAX_BYTES:
        return None
    return [_PREFIX.pack(len(header)), *frames]


def frames_of(data: bytes) -> list | None:
    """The frames (header, then the packed frame if any) of a received link message, as
    memoryviews, or None for a malformed one."""
    if len(data) < _PREFIX.size:
        return None
    end = _PREFIX.size + _PREFIX.unpack_from(data)[0]
    if end > len(data):
        return None
    view = memoryview(data)
    if end == len(data):
        return [view[_PREFIX.size : end]]
    return [view[_PREFIX.size : end], view[end:]]


# Every open link of this process, so that a forked child closes its copies at once: the
# child never uses its parent's links, and a copy it held would keep the server from seeing
# the parent close (or lose) a link until the child exits.
_OPEN: weakref.WeakSet = weakref.WeakSet()


def _close_inherited() -> None:
    for link in list(_OPEN):
        link.sock.close()
    _OPEN.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited)


class LinkClosed(ConnectionError):
    """The server closed a direct link (it stopped or was killed)."""


class DirectLink:
    """The client's end of a direct link (one per thread, beside its ZeroMQ socket).

    Args:
        sock: a connected, accepted seqpacket socket.
        name: the server's listening socket (its abstract name).
    """

    def __init__(self, sock: socket.socket, name: str = "", compact: bool = False):
        sock.setblocking(False)
        self.name = name
        self.compact = compact  # the server reads compact messages (rlreplay.net.compact)
        self.sock = sock
        self.fd = sock.fileno()
        self._sendmsg = sock.sendmsg
        self._recv = sock.recv
        _OPEN.add(self)

    @classmethod
    def open(cls, offer: Any, until: float | None) -> DirectLink:
        """Connect to the server's listening socket named in ``offer`` (a ping reply's
        ``"direct"`` entry), present its token and wait for the server to accept it (at
        most :data:`OPEN_TIMEOUT_S`, and never past ``until``).

        Raises:
            OSError: if the offer is malformed, the connection fails or the server refused
                the token or did not answer in time (the caller stays on ZeroMQ).
        """
        if not isinstance(offer, dict):
            raise OSError("malformed direct-link offer")
        name, token = offer.get("name"), offer.get("token")
        if not isinstance(name, str) or not isinstance(token, bytes) or not name:
            raise OSError("malformed direct-link offer")
        limit = OPEN_TIMEOUT_S
        if until is not None:
            limit = min(limit, until - time.monotonic())
        if limit <= 0:
            raise OSError("no time left to open a direct link")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.settimeout(limit)
            sock.connect("\0" + name)
            sock.send(token)
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            if not poller.poll(max(1, int(limit * 1000))):
                raise OSError("the server did not accept the direct link in time")
            if sock.recv(64) != ACCEPTED:
                raise OSError("the server refused the direct link")
        except BaseException:
            sock.close()
            raise
        return cls(sock, name, offer.get("compact") is True)

    def send(self, frames: Sequence[Any]) -> bool:
        """Send one request without blocking; False (nothing sent) if it does not fit a
        link message (:data:`DIRECT_MAX_BYTES`, or less where the socket's send buffer is
        smaller) or the server's queue is full.

        Raises:
            LinkClosed: the server closed the link (nothing sent).
        """
        buffers = message(frames)
        if buffers is None:
            return False
        try:
            self._sendmsg(buffers)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:  # more than this socket's send buffer holds
                return False
            raise LinkClosed(str(exc)) from None  # EPIPE, ECONNRESET: the server's end closed
        return True

    def send_raw(self, buffers: Sequence[Any]) -> bool:
        """:meth:`send` of a message already framed, as its buffers: a compact request
        (:mod:`rlreplay.net.compact`), which is at most :data:`DIRECT_MAX_BYTES`.

        Raises:
            LinkClosed: the server closed the link (nothing sent).
        """
        try:
            self._sendmsg(buffers)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                return False
            raise LinkClosed(str(exc)) from None
        return True

    def receive(self) -> bytes | None:
        """The next message, or None if none waits.

        Raises:
            LinkClosed: the server closed the link.
        """
        try:
            data = self._recv(DIRECT_MAX_BYTES)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise LinkClosed(str(exc)) from None
        if not data:
            raise LinkClosed("the server closed the direct link")
        return data

    def close(self) -> None:
        _OPEN.discard(self)
        self.sock.close()
