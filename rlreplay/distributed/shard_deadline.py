"""When a call of a sharded client gives up: one deadline, fixed when the call starts and
passed to every part of it.

A public call of a :class:`~rlreplay.distributed.ShardedClient` talks to several shards in
several steps (handshakes, descriptions, state probes, the requests themselves, draws
again after a shard went down). Each step is bounded by the same :class:`Deadline`, made
once per call, never by a fresh ``call_timeout`` of its own, so the whole call is bounded
as one :class:`~rlreplay.Client` call is: by its ``timeout`` (plus the client's reply
grace), or by ``call_timeout`` for what never blocks when it has none.

A shard that does not answer must not use up the other shards' time: handshakes with the
shards a call needs go out together (:func:`greet`), and they and the looks at why
shards are silent get half the time the call has left (at most ``call_timeout``), so that
under ``on_shard_down="skip"`` the call still has the other half to go on over the shards
that answered.
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
        timeout: the call's ``timeout``: seconds a shard's rate limiter may block it,
            ``None`` for no limit, or ``CALL`` for a call that never blocks.

    Attributes:
        timeout: as given (sent to the shards whose rate limiters may block the call).
        until: ``time.monotonic()`` at which waits for replies end (``timeout`` plus
            the reply grace, or ``call_timeout`` for ``CALL``); None: no limit (a wait
            lasts while the shard answers pings).
        waits_end: when waiting for the shards' rate limiters ends: ``timeout`` from the
            call's start (``until`` for ``CALL``; None with ``until``). The client's own
            polling stops there, so the requests then in flight keep the reply grace: a
            shard that answers within it is never taken for one that is down.
        bound: when the parts that never block (handshakes, descriptions, state probes,
            routed updates) give up: ``until``, or ``call_timeout`` from the call's start
            when ``until`` is None.
    """

    def __init__(self, transport: Any, timeout: Any = CALL):
        self.timeout = timeout
        self.call_timeout: float = transport.call_timeout
        self.until: float | None = transport.until(timeout)
        grace = 0.0 if timeout is CALL else REPLY_GRACE_S
        self.waits_end: float | None = None if self.until is None else self.until - grace
        self.bound: float = transport.until(CALL) if self.until is None else self.until

    def grant_grace(self) -> None:
        """Leave the call at least the reply grace from now: a shard found down at the
        end of the call's time used it up, and the shard the call goes on with (under
        ``"skip"``) must get time to answer."""
        floor = time.monotonic() + REPLY_GRACE_S
        if self.until is not None:
            self.until = max(self.until, floor)
        self.bound = max(self.bound, floor)

    def greeting(self, look_s: float) -> tuple[float, float]:
        """When a greeting started now ends: ``(handshakes, looks)``, the
        ``time.monotonic()`` at which its handshakes give up and at which the looks at
        why shards are silent end. The greeting takes half the time left before
        ``bound``, or ``call_timeout`` if less (a handshake never blocks: a shard down is
        found out then, not at the end of a long ``timeout``); its looks take the last
        ``look_s`` of it, at most a quarter."""
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
    """Open this thread's connection to each of ``indices`` not greeted yet: their
    handshakes in flight together, within :meth:`Deadline.greeting`; returns the shards
    that did not answer (the rest of the call leaves them out, whatever the shard-down
    policy's retry time).

    Every reply is read as soon as it arrives (a channel learns its server's clock from
    the time it reads a reply: one left unread while another shard is awaited would make
    the later requests' ``expires`` early by that long).

    Args:
        shards: one :class:`~rlreplay.Client` per shard.
        failed: called with a shard that did not answer and its error (the shard-down
            policy's ``failed``: it raises under ``"fail"``, the call goes on under
            ``"skip"``).
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
        # Why each is silent is looked at within the greeting's looks, shared by the
        # silent shards: their looks must not use up the time of the shards that answered.
        for shard in list(pings):  # no answer by ``until``
            tr = shards[shard].transport
            message = (
                f"no reply to the handshake from the replay server at {tr.address} within "
                f"{until - started:.3g}s"
            )
            share = (looks_end - time.monotonic()) / len(pings)  # (the shards left to look at)
            verdict = tr.diagnose(min(tr.diagnose_s, share)) if share > 0.01 else "silent"
            try:  # as a wait with a deadline that got no answer concludes
                tr.waits.no_answer(tr.channel(), pings.pop(shard), message, verdict)
            except ServerUnavailableError as error:
                note(shard, error)
    finally:
        for shard, rid in pings.items():  # an error left these unread
            shards[shard].transport.channel().forget([rid])
    return silent
