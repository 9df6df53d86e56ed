"""Calls a rate limiter blocks, parked on the server until a table changes or they expire.

A parked call is answered when it completes, at its deadline, when its client is gone or
its lease ended, or when the server stops; a parked sample is served only to a connected
client. A call parked past ``warn_after`` logs one warning, also sent to its client.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from rlreplay.errors import ReplayError, ReplayTimeoutError
from rlreplay.net.server.jobs import Job, WriteJob
from rlreplay.net.server.limits import ClientLedger

log = logging.getLogger("rlreplay.net")

Reply = Callable[..., None]

# Least interval between two passes of :meth:`ParkedCalls.watch`.
WATCH_S = 0.1


class ParkedCalls:
    """The parked calls of one server, in arrival order.

    Args:
        clients: the server's per-client ledger (parked counts, last contact).
        expiry_s: seconds of client silence after which a deadline-less call is dropped.
        reply: ``reply(identity, rid, header, arrays)`` sends a result.
        reply_error: ``reply_error(identity, rid, exc)`` sends an error.
        reachable: as :meth:`~rlreplay.net.server.replies.Replies.reachable`.
        notify: ``notify(identity, rid, message)`` sends a call's client a warning to log.
    """

    def __init__(
        self,
        clients: ClientLedger,
        expiry_s: float,
        reply: Reply,
        reply_error: Reply,
        reachable: Callable[[Any], bool | None],
        notify: Reply,
    ):
        self.clients = clients
        self.expiry_s = expiry_s
        self._reply, self._reply_error = reply, reply_error
        self._reachable = reachable
        self._notify = notify
        self._jobs: list[Job] = []
        self._next_watch = 0.0

    def may_go(self, store: Any) -> bool:
        """Whether a call parked on ``store`` would now be admitted. Called from any thread with
        the store's lock held: it reads a snapshot of the jobs, which only the dispatcher
        changes."""
        return any(job.table.store is store and job.may_go() for job in tuple(self._jobs))

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(list(self._jobs))

    def park(self, job: Job, client: bytes, now: float, lease: float | None = None) -> None:
        """Keep ``job`` of ``client`` until it completes or expires."""
        job.parked_at = now
        job.lease = lease
        job.accounted_at = now  # blocked time up to here is already counted
        job.warned = False
        job.client = client
        self.clients.park(client, now)
        self._jobs.append(job)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a parked call (None if none has one)."""
        return min((j.deadline for j in self._jobs if j.deadline is not None), default=None)

    def retry(self) -> None:
        """Retry the parked calls (samples only for reachable clients)."""
        progress = True
        while progress and self._jobs:
            progress = False
            for job in list(self._jobs):
                if job.delivered_only and job.ready():
                    reachable = self._reachable(job.identity)
                    if reachable is None:
                        continue  # not reading now: stays parked
                    if not reachable:
                        self._finish(job)
                        log.info("dropped a parked %s: its client's connection is gone", job.what)
                        continue
                try:
                    reply = job.attempt()
                except Exception as exc:
                    if not isinstance(exc, ReplayError):
                        log.exception("internal error resuming a parked request")
                        exc = ReplayError(f"internal server error: {exc!r}")
                    self._drop(job, exc)
                    progress = True
                    continue
                if reply is not None:
                    self._finish(job)
                    self._reply(job.identity, job.rid, *reply)
                    progress = True

    def expire(self, now: float) -> None:
        """Answer calls past their deadline; drop those of clients that gave up."""
        for job in list(self._jobs):
            if job.deadline is not None:
                if now < job.deadline:
                    continue
                self._drop(job, job.timeout_error(now - job.parked_at))
                continue
            if job.lease is not None:
                lease = max(job.lease, self.clients.lease_of(job.client))
                if now >= lease:
                    self._drop(
                        job,
                        ReplayTimeoutError(
                            f"the {job.what} was dropped: its client may have given up on "
                            f"this server {now - lease:.3g}s ago (its lease was not renewed: "
                            "nothing was sent or waited for on its socket since)"
                        ),
                    )
                    continue
            silent = self.clients.silent_for(job.client, now)
            if silent >= self.expiry_s:
                self._drop(
                    job,
                    ReplayTimeoutError(
                        f"the {job.what} was dropped: its client sent nothing for {silent:.3g}s "
                        f"(the server's parked_expiry_s={self.expiry_s:g})"
                    ),
                )

    def watch(self, now: float) -> None:
        """Count parked calls' blocked time and warn once past ``warn_after``."""
        if now < self._next_watch:
            return
        self._next_watch = now + WATCH_S
        for job in list(self._jobs):
            if job.counter is None:  # not blocked by a table (a checkpoint being written)
                continue
            self._account(job, now)
            if job.warned:
                continue
            warn_after = job.table.warn_after
            if warn_after is not None and now - job.parked_at >= warn_after:
                job.warned = True
                message = job.blocked_message()
                log.warning("parked %s", message)
                self._notify(
                    job.identity,
                    job.rid,
                    f"{message} (a call of this process, parked on the replay server)",
                )

    def cancel(self, client: bytes, rids: list[int]) -> int:
        """Drop ``client``'s parked calls ``rids`` unanswered; returns how many were parked."""
        wanted = set(rids)
        dropped = 0
        for job in list(self._jobs):
            if job.client == client and job.rid in wanted:
                self._finish(job)
                if isinstance(job, WriteJob):
                    job.abort()
                dropped += 1
        return dropped

    def close(self, exc: ReplayError) -> None:
        """Answer every parked call with ``exc`` (the server is stopping)."""
        for job in list(self._jobs):
            self._drop(job, exc)

    def _drop(self, job: Job, exc: BaseException) -> None:
        self._finish(job)
        if isinstance(job, WriteJob):
            job.abort()
        self._reply_error(job.identity, job.rid, exc)

    def _finish(self, job: Job) -> float:
        """Unpark ``job`` and count the time it waited as the limiter's blocked time."""
        self._jobs.remove(job)
        self.clients.unpark(job.client)
        now = time.monotonic()
        self._account(job, now)
        return now - job.parked_at

    def _account(self, job: Job, now: float) -> None:
        """Add the time ``job`` waited since last counted to its limiter's blocked time."""
        waited = now - job.accounted_at
        job.accounted_at = now
        if job.counter is None or waited <= 0.0:
            return
        with job.table.mutex:
            lim = job.table.rate_limiter
            setattr(lim, job.counter, getattr(lim, job.counter) + waited)


def cap_deadline(job: Job, expires: Any) -> None:
    """End ``job`` no later than ``expires`` (when its client stops waiting), if given."""
    if expires is not None:
        job.deadline = expires if job.deadline is None else min(job.deadline, expires)


def refuse_lapsed(job: Job, lease: float | None, now: float) -> None:
    """Refuse deadline-less ``job`` if its request arrived after its ``lease``.

    Raises:
        ReplayTimeoutError: the request arrived after its lease; nothing was applied.
    """
    if job.deadline is None and lease is not None and now >= lease:
        if isinstance(job, WriteJob):
            job.abort()
        raise ReplayTimeoutError(
            f"the {job.what} reached the server {now - lease:.3g}s after its client could "
            "have given up on this server; it was not applied"
        )
