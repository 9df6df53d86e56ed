"""How a client waits for a reply, and what a wait that gets none concludes.

A :class:`ReplyWaits` belongs to one :class:`~rlreplay.net.client.transport.Transport` and waits on
the transport's per-thread channels: it pings a silent server (to tell a busy server from a
dead one, and to renew the socket's lease), raises a failed reply's typed error, and when a
wait hears nothing, decides whether that call fails alone or the socket is dropped with
everything queued in it (``docs/protocol.md``: "Blocking, deadlines and liveness").
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import zmq

from rlreplay.errors import (
    InvalidArgumentError,
    ReplayTimeoutError,
    ServerUnavailableError,
)
from rlreplay.net.client.channel import Channel
from rlreplay.net.wire import auth, codec

if TYPE_CHECKING:
    from rlreplay.net.client.transport import Transport

# Extra seconds a client waits past a call's timeout for the server's own timeout reply.
REPLY_GRACE_S = 0.5


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
                this call fails alone (see :meth:`_no_answer`); without a deadline, after
                ``2 * liveness_s`` of silence, the socket is dropped with everything still
                queued in it and every other request outstanding on it fails the same way.
                Either way none of them is applied later.
            ServerRestartedError: if the server restarted since the request was sent.
            ReplayTimeoutError: if the server answers but this call did not complete (its
                reply is dropped when it comes).
        """
        start = time.monotonic()
        ch = self.tr.channel()
        outer = ch.waiting_since
        ch.waiting_since = start if outer is None else outer
        try:
            return self._wait(ch, rid, until, start)
        finally:
            ch.waiting_since = outer

    def _wait(
        self, ch: Channel, rid: int, until: float | None, start: float
    ) -> tuple[dict, dict]:
        """The loop of :meth:`wait_until` (``ch.waiting_since`` set)."""
        last_ping = ping_sent = -float("inf")
        ping_s = self.tr.liveness_s / 2
        while rid not in ch.replies:
            now = time.monotonic()
            silent = now - max(ch.last_heard, start)
            if until is not None and now >= until:
                if ch.last_heard > ping_sent:
                    ch.abandon(rid)
                    raise ReplayTimeoutError(
                        f"the replay server at {self.tr.address} answers, but this call "
                        f"did not complete within {until - start:.3g}s"
                    )
                self._no_answer(
                    ch,
                    rid,
                    f"no reply from the replay server at {self.tr.address} within "
                    f"{until - start:.3g}s",
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
                wait = min(wait, until - now - (REPLY_GRACE_S if ping_sent < start else 0.0))
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

    def _no_answer(self, ch: Channel, rid: int, message: str) -> None:
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
            self.unavailable(ch, message)  # the server refuses all of them from now on
        # The next request first pings: a server that restarted meanwhile shows its new
        # epoch (failing what the old one had taken) before that request is stamped.
        ch.greeted = False
        ch.abandon(rid)
        raise self._diagnosed(message) from None

    def unavailable(self, ch: Channel, message: str) -> None:
        """Drop the channel's socket and queued requests; raise ServerUnavailableError.

        The socket is dropped first, so nothing it queued can reach a server that comes
        back; then :meth:`_diagnosed` says why the server did not answer.
        """
        ch.reset(message)
        raise self._diagnosed(message) from None

    def _diagnosed(self, message: str) -> ServerUnavailableError:
        """The ServerUnavailableError of a call that got no answer: ``message`` and why,
        where a short look at a new connection's handshake (at most ``diagnose_s``) can
        tell: nothing accepts connections at the address, or which CURVE credential the
        server refused (also the error's ``reason``)."""
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
                self.tr.address, self.tr._server_key, self.tr._client_keys, timeout=timeout
            )
        except (zmq.ZMQError, InvalidArgumentError):
            return None

