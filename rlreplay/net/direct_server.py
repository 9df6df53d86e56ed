"""Direct links, the server's half: a listening Unix socket its dispatcher polls beside
its ZeroMQ socket, and the links of same-host clients (see :mod:`rlreplay.net.direct`).

Every method runs on the server's dispatcher thread. What a client may cost is bounded:
one pending token per ZeroMQ connection (a new handshake replaces it), tokens expire after
:data:`TOKEN_S`, a connection that has not presented a valid token within
:data:`TOKEN_S` is closed, and the server keeps at most ``max_links`` links and offered
tokens together (past it, no link is offered and clients stay on ZeroMQ). By default that
is :data:`MAX_LINKS`, or a quarter of the process's file descriptor limit if less, so that
links never take the descriptors the server's other sockets and files need.
"""

from __future__ import annotations

import errno
import os
import resource
import secrets
import socket
import time
import weakref
from collections.abc import Callable
from typing import Any

from rlreplay.net import compact
from rlreplay.net.direct import (
    ACCEPTED,
    DIRECT_MAX_BYTES,
    TOKEN_BYTES,
    frames_of,
    message,
    peer_credentials,
)

TOKEN_S = 10.0  # seconds a token, or a connection that has not presented one, may wait
MAX_LINKS = 1024  # links one server keeps at most (each holds a file descriptor)
ACCEPTS_PER_WAKE = 64  # connections accepted at most before the other sockets get a turn
PAUSE_S = 1.0  # seconds the listener is left alone after accepting failed


def default_max_links() -> int:
    """:data:`MAX_LINKS`, or a quarter of this process's soft limit of open files if less."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_LINKS
    return max(0, min(MAX_LINKS, soft // 4))


# Every serving DirectLinks of this process, so that a forked child closes its copies of
# their sockets at once: the child never serves them (the dispatcher thread does not survive
# a fork), and a copy it held would keep the links open after the server closed them (its
# clients would not see it stop) and keep the listening name bound.
_SERVING: weakref.WeakSet = weakref.WeakSet()


def _close_inherited() -> None:
    for links in list(_SERVING):
        links.close()
    _SERVING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited)


class DirectPeer:
    """One accepted link. It stands for the client's ZeroMQ connection where the server
    keys what a client costs (``bytes`` is that connection's routing id), and sends the
    replies to the requests that came on it. ``in_process``: the client is a thread of
    the server's own process (the dispatcher then never polls without sleeping after its
    requests: it would hold the interpreter lock that client needs to send the next)."""

    __slots__ = ("bytes", "fd", "in_process", "opened", "sock")

    def __init__(self, sock: socket.socket, opened: float, in_process: bool):
        self.sock = sock
        self.fd = sock.fileno()
        self.bytes = b""  # set when the token is accepted
        self.opened = opened
        self.in_process = in_process

    def send(self, frames: list) -> bool | None:
        """Send a reply without blocking: True if sent, False if it does not fit a link
        message (:data:`~rlreplay.net.direct.DIRECT_MAX_BYTES`, or less where the socket's
        send buffer is smaller: the caller sends it through ZeroMQ), None if it was
        dropped (a client that does not read, or a closed link)."""
        buffers = message(frames)
        if buffers is None:
            return False
        try:
            self.sock.sendmsg(buffers)
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:  # more than this socket's send buffer holds
                return False
            return None  # full queue (the client does not read) or closed: dropped
        return True

    def send_bytes(self, data: bytes) -> bool | None:
        """:meth:`send` of a message already framed (a compact reply)."""
        try:
            self.sock.send(data)
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                return False
            return None
        return True


class DirectLinks:
    """The server's listening socket and links.

    Args:
        max_links: most links (and offered tokens) kept at once; default
            :func:`default_max_links`.
        spin_s: seconds the dispatcher polls without sleeping after serving a request
            on a link of another process (:func:`~rlreplay.net.direct.spin_seconds`;
            0: it sleeps at once).

    Attributes:
        spin_until: until when the dispatcher polls without sleeping: ``spin_s`` after
            the last request served on a link of another process. A learner's next
            awaited call follows its reply within microseconds, and waking a dispatcher
            asleep in poll costs more than the call's own handling on a virtual machine.

    Raises:
        OSError: if the listening socket cannot be made (the server then offers none).
    """

    def __init__(self, max_links: int | None = None, spin_s: float = 0.0):
        self.name = "rlreplay-" + secrets.token_hex(12)
        self.max_links = default_max_links() if max_links is None else max_links
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            lst.bind("\0" + self.name)  # abstract: no file to remove, even after kill -9
            lst.listen(128)
            lst.setblocking(False)
        except BaseException:
            lst.close()
            raise
        self.listener = lst
        self.fd = lst.fileno()
        self.uid = os.getuid()
        self.pid = os.getpid()
        self._tokens: dict[bytes, tuple[bytes, float]] = {}  # token -> (client, expiry)
        self._token_of: dict[bytes, bytes] = {}  # client -> its pending token
        self.peers: dict[int, DirectPeer] = {}  # fd -> link (accepted or awaiting its token)
        self.paused_until: float | None = None  # the listener is not polled until then
        self.spin_s = spin_s
        self.spin_until = 0.0
        _SERVING.add(self)

    def offer(self, client: bytes, now: float) -> dict | None:
        """A link offer for the ZeroMQ connection ``client`` (None at ``max_links``)."""
        if len(self.peers) + len(self._tokens) >= self.max_links:
            return None
        old = self._token_of.pop(client, None)
        if old is not None:
            self._tokens.pop(old, None)
        token = secrets.token_bytes(TOKEN_BYTES)
        self._tokens[token] = (client, now + TOKEN_S)
        self._token_of[client] = token
        # "compact": this server reads compact messages (a client sends them only then)
        return {"name": self.name, "token": token, "compact": True}

    def accept(
        self,
        register: Callable[[int], None],
        unregister: Callable[[int], None],
        now: float,
    ) -> None:
        """Accept waiting connections of this server's user (others are closed at once).
        If accepting fails otherwise than for want of a connection (no file descriptor
        left, say), the listening socket is not polled for :data:`PAUSE_S` (its waiting
        connection would wake the dispatcher again at once, in a loop)."""
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError:
                unregister(self.fd)
                self.paused_until = now + PAUSE_S
                return
            try:
                pid, uid = peer_credentials(sock)
                if len(self.peers) >= self.max_links or uid != self.uid:
                    sock.close()
                    continue
                sock.setblocking(False)
            except OSError:
                sock.close()
                continue
            peer = DirectPeer(sock, now, in_process=pid == self.pid)
            self.peers[peer.fd] = peer
            register(peer.fd)

    def serve(
        self,
        fd: int,
        handle: Callable[[list], Any],
        handle_compact: Callable[[DirectPeer, bytes], Any],
        unregister: Callable[[int], None],
        now: float,
    ) -> bool:
        """Read the next message of link ``fd`` (that the poll said is readable) and hand
        its request to ``handle`` (``[peer, *frames]``, as a ZeroMQ message is ``[routing
        id, *frames]``), or a compact request (:mod:`rlreplay.net.compact`) to
        ``handle_compact`` (``peer, data``); a link's first message is its token. One
        message per poll: a link carries one awaited call of its thread at a time, and a
        message left waits for the next poll. Returns what ``handle`` returned (False for none)."""
        peer = self.peers.get(fd)
        if peer is None:
            return False
        try:
            data = peer.sock.recv(DIRECT_MAX_BYTES + 1)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not peer.bytes:  # its token
            entry = self._tokens.pop(data, None) if data else None
            if entry is None or entry[1] < now:
                self.drop(fd, unregister)
                return False
            client = entry[0]
            self._token_of.pop(client, None)
            peer.bytes = client
            try:
                peer.sock.send(ACCEPTED)
            except OSError:
                self.drop(fd, unregister)
            return False
        if len(data) > DIRECT_MAX_BYTES:  # not a link message
            self.drop(fd, unregister)
            return False
        if compact.is_request(data):
            changed = handle_compact(peer, data)
        else:
            frames = frames_of(data)
            if frames is None:  # closed by the client (b""), or not a link message
                self.drop(fd, unregister)
                return False
            changed = handle([peer, *frames])
        if self.spin_s and not peer.in_process:
            self.spin_until = time.monotonic() + self.spin_s
        return bool(changed)

    def drop(self, fd: int, unregister: Callable[[int], None]) -> None:
        """Close link ``fd``."""
        peer = self.peers.pop(fd, None)
        if peer is not None:
            unregister(fd)
            peer.sock.close()

    def sweep(
        self, now: float, register: Callable[[int], None], unregister: Callable[[int], None]
    ) -> None:
        """Forget expired tokens, close connections that never presented a valid one, and
        poll the listening socket again after a pause."""
        if self.paused_until is not None and now >= self.paused_until:
            self.paused_until = None
            register(self.fd)
        for token, (client, expiry) in list(self._tokens.items()):
            if expiry < now:
                del self._tokens[token]
                if self._token_of.get(client) == token:
                    del self._token_of[client]
        for fd, peer in list(self.peers.items()):
            if not peer.bytes and peer.opened + TOKEN_S < now:
                self.drop(fd, unregister)

    def close(self) -> None:
        """Close every link and the listening socket (its name is free again)."""
        _SERVING.discard(self)
        for peer in self.peers.values():
            peer.sock.close()
        self.peers.clear()
        self._tokens.clear()
        self._token_of.clear()
        self.listener.close()
