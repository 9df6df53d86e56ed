"""Blocked calls: one deadline per call, and one warning when a call stays blocked.

A call that may block (an insert held back by a rate limiter or by a full store, a sample
waiting for items, an append waiting for a queue's items to be consumed) creates one
:class:`BlockedCall` when it first has to wait and keeps it for every later wait of the
same call, so ``timeout`` bounds the call's *total* waiting time, not each wait.

Nothing hangs silently: a call still blocked after ``warn_after`` seconds (default
:data:`WARN_AFTER_S`, per table ``Table.warn_after``) logs one warning on the
``"rlreplay"`` logger that names the table, the limiter's state and the likely cause
("no sampler is consuming this queue", ...).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("rlreplay")

# Seconds a call may stay blocked before it logs its warning (None: never warn).
WARN_AFTER_S: float | None = 5.0
# Longest single wait: a blocked call looks at its condition again at least this often,
# so a change nobody could announce (a table or writer garbage-collected in another
# thread, which cannot take the lock to notify) still lets it go on.
POLL_S = 1.0


class Waits:
    """The calls blocked on one store, and what each of them waits for.

    Invariant: a change wakes exactly the blocked calls that may go on. A call that
    states what it waits for (``ready``, e.g. "the limiter admits my insert") is not woken
    by changes under which that still does not hold: otherwise a learner's every sample
    would wake an actor whose insert the limiter still holds back, and each such wake-up
    costs the learner the interpreter lock. A call that states nothing is woken by every
    change. Closing, resetting and detaching wake every call (:meth:`wake_all`). Each
    blocked call waits on a condition of its own over the store's mutex, so waking one
    never wakes another.

    Args:
        mutex: the store's mutex, held by every caller of this object.
    """

    __slots__ = ("blocked", "mutex")

    def __init__(self, mutex: threading.RLock):
        self.mutex = mutex
        # one entry per blocked wait: (what it waits for or None, its condition)
        self.blocked: list[tuple[Callable[[], bool] | None, threading.Condition]] = []

    def wake(self) -> None:
        """After a change (mutex held): wake the blocked calls that may go on. Each
        ``ready`` runs here, in the changing thread: it must be cheap and must not wait."""
        for ready, condition in self.blocked:
            if ready is None or ready():
                condition.notify()

    def wake_all(self) -> None:
        """Wake every blocked call (mutex held): after a close, a reset, a detach."""
        for _, condition in self.blocked:
            condition.notify()


class BlockedCall:
    """The waiting of one blocking call.

    Args:
        waits: the store's :class:`Waits` (its mutex held by the caller).
        timeout: seconds the call may wait in total (``None``: without limit).
        warn_after: seconds after which one warning is logged (``None``: never).
        describe: returns the warning's text (called once, when the warning is due).
        account: ``(object, attribute)`` to which :meth:`settle` adds the seconds blocked
            (a rate limiter's ``insert_blocked_s`` or ``sample_blocked_s``).
    """

    __slots__ = ("account", "condition", "deadline", "describe", "start", "waits", "warn_at")

    def __init__(
        self,
        waits: Waits,
        timeout: float | None,
        warn_after: float | None,
        describe: Callable[[], str],
        account: tuple[object, str] | None = None,
    ):
        now = time.monotonic()
        self.waits = waits
        self.condition = threading.Condition(waits.mutex)
        self.start = now
        self.deadline = None if timeout is None else now + timeout
        self.warn_at = None if warn_after is None else now + warn_after
        self.describe = describe
        self.account = account

    @property
    def elapsed(self) -> float:
        """Seconds since the call first blocked."""
        return time.monotonic() - self.start

    def settle(self) -> None:
        """Add the time blocked to ``account`` (once; later calls do nothing)."""
        account, self.account = self.account, None
        if account is not None:
            target, name = account
            setattr(target, name, getattr(target, name) + self.elapsed)

    def wait(self, ready: Callable[[], bool] | None = None) -> bool:
        """Wait for a notification on the lock, the deadline or the warning time (at most
        :data:`POLL_S` seconds); with ``ready``, notifications come only once it holds
        (see :class:`Waits`). The warning is logged once the call has been blocked
        ``warn_after`` seconds, even when it is woken so late that its deadline passed.

        Returns:
            False, without waiting, once the deadline has passed; True otherwise (the
            caller checks its condition again: a wake-up does not mean it holds).
        """
        now = time.monotonic()
        warn_at = self.warn_at
        if warn_at is not None and now >= warn_at:
            # before the deadline check: a call woken late, past both, still warns
            self.warn_at = warn_at = None
            log.warning(self.describe())
        deadline = self.deadline
        if deadline is not None and now >= deadline:
            return False
        limit = POLL_S if deadline is None else min(POLL_S, deadline - now)
        if warn_at is not None:
            limit = min(limit, warn_at - now)
        entry = (ready, self.condition)
        blocked = self.waits.blocked
        blocked.append(entry)
        try:
            self.condition.wait(limit)
        finally:
            blocked.remove(entry)
        return True
