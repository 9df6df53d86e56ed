"""Blocked calls: one deadline per call, and one warning when a call stays blocked.

One :class:`BlockedCall` per call, so ``timeout`` bounds its total waiting time; after
``warn_after`` seconds it logs one warning on the ``"rlreplay"`` logger.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("rlreplay")

# Seconds a call may stay blocked before it logs its warning (None: never warn).
WARN_AFTER_S: float | None = 5.0
# Longest single wait, so changes nobody could announce (a garbage-collected party) are seen.
POLL_S = 1.0


class Waits:
    """The calls blocked on one store, and what each of them waits for.

    Invariant: a change wakes exactly the blocked calls that may go on (a call stating its
    ``ready`` condition is not woken while it does not hold). Each call waits on its own
    condition over the store's mutex. Changes that free every call (close, reset, detach,
    restore) call ``wake_all``; ``ready`` runs in the changing thread and must never wait.

    Args:
        mutex: the store's mutex, held by every caller of this object.
    """

    __slots__ = ("blocked", "mutex")

    def __init__(self, mutex: threading.RLock):
        self.mutex = mutex
        # one entry per blocked wait: (what it waits for or None, its condition)
        self.blocked: list[tuple[Callable[[], bool] | None, threading.Condition]] = []

    def wake(self) -> None:
        """After a change (mutex held): wake the calls that may go on; ``ready`` must be cheap."""
        for ready, condition in self.blocked:
            if ready is None or ready():
                condition.notify()

    def wake_all(self) -> None:
        """Wake every blocked call (mutex held)."""
        for _, condition in self.blocked:
            condition.notify()


class BlockedCall:
    """The waiting of one blocking call.

    Args:
        waits: the store's :class:`Waits` (its mutex held by the caller).
        timeout: seconds the call may wait in total (``None``: without limit).
        warn_after: seconds after which one warning is logged (``None``: never).
        describe: returns the warning's text.
        account: ``(object, attribute)`` to which :meth:`settle` adds the seconds blocked.
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
        """Add the time blocked to ``account`` (once)."""
        account, self.account = self.account, None
        if account is not None:
            target, name = account
            setattr(target, name, getattr(target, name) + self.elapsed)

    def wait(self, ready: Callable[[], bool] | None = None) -> bool:
        """Wait for a notification, the deadline or the warning time (at most :data:`POLL_S`).

        Returns:
            False, without waiting, once the deadline has passed; True otherwise (the caller
            checks its condition again).
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
