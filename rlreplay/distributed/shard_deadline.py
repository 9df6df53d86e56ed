"""When a call of a sharded client gives up: one deadline, fixed when the call starts.

Every step of a call is bounded by the same :class:`Deadline`, so it is bounded as one
:class:`~rlreplay.Client` call is; handshakes (:func:`greet`) get at most half of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from rlreplay.errors import ServerUnavailableError
from rlreplay.net.client.transport import CALL, REPLY_GRACE_S


class Deadline:
    """The deadline of one sharded call.

    Args:
        transport: a shard client's transport (its ``call_timeout`` and reply grace).
        timeout: seconds a shard's rate limiter may block the call, ``None`` for no limit,
            or ``CALL`` for a call that never blocks.

    Attributes:
        timeout: as given.
        until: ``time.monotonic()`` at which waits for replies end; None: no limit.
        waits_end: when waiting for the shards' rate limiters ends.
        bound: when the parts that never block give up.
    """

    def __init__(self, transport: Any, timeout: Any = CALL):
        self.timeout = timeout
        self.call_timeout: float = transport.call_timeout
        self.until: float | None = transport.until(timeout)
        grace = 0.0 if timeout is CALL else REPLY_GRACE_S
        self.waits_end: float | None = None if self.until is None else self.until - grace
        self.bound: float = transport.until(CALL) if self.until is None else self.until

    def grant_grace(self) -> None:
        """Leave the call at least the reply grace from now, for the shard it goes on with."""
        floor = time.monotonic() + REPLY_GRACE_S
        if self.until is not None:
            self.until = max(self.until, floor)
        self.bound = max(self.bound, floor)

    def greeting(self, look_s: float) -> tuple[float, float]:
        """``(handshakes, looks)``: when a greeting started now gives up, and when its looks end."""
        now = time.monotonic()
        span = min(max(self.bound - now, 0.0) / 2, self.call_timeout)
        return now + span - min(look_s, span / 4), now + span

    def __repr__(self) -> str:
        return f"Deadline(timeout={self.timeout!r}, in {self.bound - time.monotonic():.3g}s)"


def greet(
    shards: list,
    indices: Iterable[int],
    deadline: Deadline,
    failed: Callable[[int, ServerUnavailableError], None],
) -> set[int]:
    """Open this thread's connection to each of ``indices`` not greeted yet, all at once.

    Returns the shards that did not answer within :meth:`Deadline.greeting`. Replies are read as
    they arrive: a channel learns the server's clock offset when it reads, so a reply left unread
    would make that shard's later ``expires`` early.

    Args:
        shards: one :class:`~rlreplay.Client` per shard.
        failed: called with a silent shard and its error (raises under ``"fail"``).
    """
    pings: dict[int, int] = {}
    silent: set[int] = set()
    started = until = looks_end = 0.0

    def note(shard: int, error: ServerUnavailableError) -> None:
        silent.add(shard)
        failed(shard, error)

    try:
        for shard in indices:
            tr = shards[shard].transport
            if tr.channel().greeted:
                continue
            if not pings and not until:
                started = time.monotonic()
                until, looks_end = deadline.greeting(tr.diagnose_s)
            try:
                pings[shard] = tr.send({"op": "ping"}, until=until)
            except ServerUnavailableError as error:
                note(shard, error)
        if not pings:
            return silent
        poller = zmq.Poller()
        for shard in pings:
            poller.register(shards[shard].transport.channel().sock, zmq.POLLIN)
        while pings:
            for shard in list(pings):
                tr = shards[shard].transport
                ch = tr.channel()
                ch.receive()
                if pings[shard] not in ch.replies:
                    continue
                try:
                    tr.wait_until(pings.pop(shard), until)  # its reply: a typed error if failed
                except ServerUnavailableError as error:  # (restarted meanwhile, say)
                    note(shard, error)
                    continue
                ch.greeted = True
            left = until - time.monotonic()
            if not pings or left <= 0:
                break
            poller.poll(max(1, int(left * 1000)))
        # Silent shards share the looks' time, not that of the shards that answered.
        for shard in list(pings):  # no answer by ``until``
            tr = shards[shard].transport
            message = (
                f"no reply to the handshake from the replay server at {tr.address} within "
                f"{until - started:.3g}s"
            )
            share = (looks_end - time.monotonic()) / len(pings)
            verdict = tr.diagnose(min(tr.diagnose_s, share)) if share > 0.01 else "silent"
            try:  # as a wait with a deadline that got no answer concludes
                tr.waits.no_answer(tr.channel(), pings.pop(shard), message, verdict)
            except ServerUnavailableError as error:
                note(shard, error)
    finally:
        for shard, rid in pings.items():  # an error left these unread
            shards[shard].transport.channel().forget([rid])
    return silent
