"""Per-client bookkeeping of a :class:`~rlreplay.Server`: what each client costs it.

A request over a client's limit, or whose envelope shows it is for another server or too
late (:func:`check_envelope`), is refused before it runs.
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
    up; returns its ``expires`` (server ``time.monotonic()`` clock) or None.

    Args:
        header: the request's header (optional ``epoch`` and ``expires``).
        op: its operation (a ``ping`` is answered whatever its epoch).
        epoch, now: this server's epoch and ``time.monotonic()``.

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
    """The request's ``lease`` (server ``time.monotonic()`` clock), or None.

    A call parked without a timeout is never applied past its socket's latest lease.

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
        max_unread_bytes: reply bytes ZeroMQ may hold for one client not reading them;
            over it, its requests (other than ``ping``) are refused.
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

    def admit(self, client: bytes, op: Operation) -> None:
        """Refuse ``op`` from ``client`` if it is over a limit.

        Raises:
            ResourceLimitError: if the client's unread replies or parked calls are at
                their limit (nothing has run).
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
        # replies leave in order: the first one not done ends the scan
        while queue and queue[0][0].done:
            total -= queue.popleft()[1]
        if not queue:
            del self._unread[client], self._unread_bytes[client]
            return 0
        self._unread_bytes[client] = total
        return total

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

    def prune(self) -> None:
        """Forget replies ZeroMQ has released (also of clients never heard from again)."""
        for client in list(self._unread):
            self.unread_bytes(client)
