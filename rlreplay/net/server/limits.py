"""Per-client bookkeeping of a :class:`~rlreplay.Server`: what each client costs it.

A server answers many clients from one thread; one misbehaving client must not take the
memory the others need. The ledger holds, per client connection (ZeroMQ routing id):

- the bytes of large replies ZeroMQ still holds for it (a client that sends requests and
  never reads the replies would otherwise pin ``SNDHWM`` replies of any size);
- how many of its calls are parked (waiting for a rate limiter);
- when it was last heard from, while it has parked calls (so calls parked without a
  deadline by a client that vanished are dropped).

A request that would go over a limit is refused before it runs (nothing is applied), with
:class:`~rlreplay.errors.ResourceLimitError`. So is a request whose envelope shows it is
not for this server or too late (:func:`check_envelope`).
"""

from __future__ import annotations

import math
from collections import deque

import zmq

from rlreplay.errors import (
    InvalidArgumentError,
    ProtocolError,
    ReplayTimeoutError,
    ResourceLimitError,
    ServerRestartedError,
    describe,
)
from rlreplay.net.wire.schema import Operation


def check_limit(name: str, value: object, minimum: float, integer: bool = False) -> float:
    """``value`` as a number ``>= minimum``; raises InvalidArgumentError naming ``name``."""
    kinds = (int,) if integer else (int, float)
    if not isinstance(value, kinds) or isinstance(value, bool) or not value >= minimum:
        kind = "an int" if integer else "a number"
        raise InvalidArgumentError(f"{name}={describe(value)} must be {kind} >= {minimum}")
    return value


def check_envelope(header: dict, op: str, epoch: int, now: float) -> float | None:
    """Refuse a request meant for an earlier server, or one arriving after its client gave
    up; returns its ``expires`` time (in the server's ``time.monotonic()`` clock) or None.

    Args:
        header: the request's header; ``epoch`` and ``expires`` are optional.
        op: its operation (a ``ping`` is answered whatever its epoch).
        epoch: this server's epoch.
        now: this server's ``time.monotonic()``.

    Raises:
        ServerRestartedError: the request is stamped with another server's epoch.
        ReplayTimeoutError: the request arrived after its ``expires`` time.
        ProtocolError: for an ``epoch`` or ``expires`` that is not a number.
    """
    stamp, expires = header.get("epoch"), header.get("expires")
    if stamp is not None and op != "ping":
        if not isinstance(stamp, int) or isinstance(stamp, bool):
            raise ProtocolError(f"request field 'epoch' is {describe(stamp)}, not an int")
        if stamp != epoch:
            raise ServerRestartedError(
                f"the request was sent to an earlier server at this address (epoch {stamp}); "
                f"this server (epoch {epoch}) started since and did not apply it"
            )
    if expires is None:
        return None
    if not isinstance(expires, (int, float)) or isinstance(expires, bool):
        raise ProtocolError(f"request field 'expires' is {describe(expires)}, not a number")
    if now > expires:
        raise ReplayTimeoutError(
            f"the request reached the server {now - expires:.3g}s after its client stopped "
            "waiting for it; it was not applied"
        )
    return float(expires)


def check_lease(header: dict) -> float | None:
    """The request's ``lease`` (in the server's ``time.monotonic()`` clock), or None.

    Each message of a client carries ``lease``: a time before which its client cannot have
    declared the server unavailable and dropped its socket (see
    :meth:`rlreplay.net.client.transport.Transport.lease_of`). The server never applies a call
    parked without a timeout past the latest lease of its socket.

    Raises:
        ProtocolError: for a ``lease`` that is not a number.
    """
    lease = header.get("lease")
    if lease is None:
        return None
    if not isinstance(lease, (int, float)) or isinstance(lease, bool):
        raise ProtocolError(f"request field 'lease' is {describe(lease)}, not a number")
    return float(lease)


class ClientLedger:
    """Unread reply bytes, parked calls and last contact of each client of a server.

    Args:
        max_unread_bytes: bytes of replies ZeroMQ may hold for one client that is not
            reading them; while a client is over it, its requests (other than ``ping``) are
            refused. A client may go over by at most one reply.
        max_parked_per_client: calls of one client that may wait parked at once; a further
            ``insert``, ``sample`` or ``write`` request is refused.
    """

    def __init__(self, max_unread_bytes: int, max_parked_per_client: int):
        self.max_unread_bytes = max_unread_bytes
        self.max_parked_per_client = max_parked_per_client
        self._unread: dict[bytes, deque[tuple[zmq.MessageTracker, int]]] = {}
        self._unread_bytes: dict[bytes, int] = {}
        self._parked: dict[bytes, int] = {}
        self._seen: dict[bytes, float] = {}
        self._leases: dict[bytes, float] = {}
        self.refused = 0  # requests refused for a limit since the server started

    # ----------------------------------------------------------------- checks
    def admit(self, client: bytes, op: Operation) -> None:
        """Refuse ``op`` from ``client`` if it is over a limit.

        Raises:
            ResourceLimitError: if the client's unread replies or parked calls are at
                their limit (nothing of the request has run).
        """
        if client in self._unread and op.name != "ping":
            unread = self.unread_bytes(client)
            if unread > self.max_unread_bytes:
                self.refused += 1
                raise ResourceLimitError(
                    f"this client has {unread} bytes of replies it has not read (the server's "
                    f"max_unread_bytes={self.max_unread_bytes}); read replies before sending "
                    "more requests"
                )
        if op.parks and self._parked.get(client, 0) >= self.max_parked_per_client:
            self.refused += 1
            raise ResourceLimitError(
                f"this client has {self._parked[client]} calls waiting on rate limiters (the "
                f"server's max_parked_per_client={self.max_parked_per_client}); wait for them "
                "before sending more"
            )

    # ------------------------------------------------------------ unread bytes
    def sent(self, client: bytes, tracker: zmq.MessageTracker, nbytes: int) -> None:
        """Record a large reply to ``client`` that ZeroMQ holds until ``tracker`` is done."""
        if tracker.done:
            return
        self._unread.setdefault(client, deque()).append((tracker, nbytes))
        self._unread_bytes[client] = self._unread_bytes.get(client, 0) + nbytes

    def unread_bytes(self, client: bytes) -> int:
        """Bytes of large replies ZeroMQ still holds for ``client`` (sent ones dropped)."""
        queue = self._unread.get(client)
        if queue is None:
            return 0
        total = self._unread_bytes[client]
        # Replies leave a connection in order, so the first one not done ends the scan.
        while queue and queue[0][0].done:
            total -= queue.popleft()[1]
        if not queue:
            del self._unread[client], self._unread_bytes[client]
            return 0
        self._unread_bytes[client] = total
        return total

    # ----------------------------------------------------------- parked calls
    def park(self, client: bytes, now: float) -> None:
        self._parked[client] = self._parked.get(client, 0) + 1
        self._seen.setdefault(client, now)

    def unpark(self, client: bytes) -> None:
        left = self._parked.get(client, 0) - 1
        if left > 0:
            self._parked[client] = left
        else:
            self._parked.pop(client, None)
            self._seen.pop(client, None)
            self._leases.pop(client, None)

    def renew(self, client: bytes, lease: float) -> None:
        """Note a ``lease`` sent by ``client`` (kept only while it has parked calls)."""
        if client in self._parked and lease > self._leases.get(client, -math.inf):
            self._leases[client] = lease

    def lease_of(self, client: bytes) -> float:
        """The latest lease ``client`` sent since it parked a call (-inf if none)."""
        return self._leases.get(client, -math.inf)

    def heard(self, client: bytes, now: float) -> None:
        """Note a message from ``client`` (kept only while it has parked calls)."""
        if client in self._seen:
            self._seen[client] = now

    def silent_for(self, client: bytes, now: float) -> float:
        """Seconds since ``client`` was last heard from (0 if it has no parked calls)."""
        return now - self._seen.get(client, now)

    # ------------------------------------------------------------- housekeeping
    def prune(self) -> None:
        """Forget replies ZeroMQ has released (also of clients never heard from again)."""
        for client in list(self._unread):
            self.unread_bytes(client)
