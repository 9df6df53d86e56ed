"""A table's admission: its rate limiter, the waits of blocked calls, and closing.

Closing wakes every waiting call with :class:`ClosedError`. Every method expects the
store's lock held.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlreplay.core import waiting
from rlreplay.core.rate_limiters import RateLimiter
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    RateLimiterTimeoutError,
    check_timeout,
)

if TYPE_CHECKING:
    from rlreplay.core.item_index import ItemIndex
    from rlreplay.core.storage import StepStore


def check_warn_after(seconds: Any) -> float | None:
    """Validate ``warn_after`` (seconds > 0, or ``None`` for never).

    Raises:
        InvalidArgumentError: for anything else.
    """
    return check_timeout(
        seconds, "warn_after", "never warn about blocked calls (false in a config file)"
    )


class Admission:
    """Rate limiting and blocked-call waiting of one table.

    Args:
        name: the table's name (for messages).
        rate_limiter, index, store: the table's limiter, items and step store.
        max_times_sampled: the table's limit.
        warn_after: seconds before a blocked call's warning (``None``: never).
    """

    def __init__(
        self,
        name: str,
        rate_limiter: RateLimiter,
        index: ItemIndex,
        store: StepStore,
        max_times_sampled: int,
        warn_after: float | None,
    ):
        self.name = name
        self.rate_limiter = rate_limiter
        self.index = index
        self.store = store
        self.max_times_sampled = max_times_sampled
        self.warn_after = warn_after
        self.closed = False

    def blocked_call(self, timeout: float | None, what: str, n: int = 1) -> waiting.BlockedCall:
        """The waiting of one blocked ``what`` of ``n`` items on this table."""
        return waiting.BlockedCall(
            self.store.waits,
            timeout,
            self.warn_after,
            lambda: self.describe(what, n),
            (self.rate_limiter, f"{what}_blocked_s"),
        )

    def describe(self, what: str, n: int = 1) -> str:
        """The warning of a call of ``n`` items blocked for ``warn_after`` seconds."""
        return (
            f"{what} on table {self.name!r} has been blocked for over {self.warn_after:g}s "
            f"({self.state()}): {self.likely_cause(what, n)}"
        )

    def timeout_message(self, what: str, waited: float | None, n: int = 1) -> str:
        """The message of a ``what`` of ``n`` items that timed out after ``waited`` seconds."""
        return (
            f"{what} on table {self.name!r} was blocked by its rate limiter for {waited}s "
            f"({self.state()}): {self.likely_cause(what, n)}"
        )

    def state(self) -> str:
        """The table's size and the limiter's counters, for messages."""
        lim = self.rate_limiter
        return (
            f"size={self.index.size}/{self.index.max_size}, inserts={lim.inserts}, "
            f"samples={lim.samples}, {lim!r}"
        )

    def likely_cause(self, what: str, n: int = 1) -> str:
        """Why a ``what`` of ``n`` items is held back, in words."""
        lim = self.rate_limiter
        if what == "insert" and lim.can_insert(n, self.index.size):
            blocker = self.store.overwrite.blocker
            cause = (
                f"the store's rows hold items of queue table {blocker!r}: no sampler is "
                "consuming that queue"
            )
        elif what == "insert" and self.max_times_sampled == 1:
            cause = "no sampler is consuming this queue (each item waits to be sampled once)"
        elif what == "insert":
            cause = (
                f"samples_per_insert={lim.samples_per_insert:g} ratio: the learner (sampler) "
                "is behind, and inserts wait until it samples more"
            )
        elif self.index.size < lim.min_size_to_sample:
            cause = (
                f"the table holds {self.index.size} of the min_size_to_sample="
                f"{lim.min_size_to_sample} items sampling needs: no writer is inserting "
                "(or too slowly)"
            )
        else:
            cause = (
                f"samples_per_insert={lim.samples_per_insert:g} ratio: the actors (inserts) "
                "are behind, and samples wait until more items are inserted"
            )
        return cause

    def wait_until(
        self,
        allowed: Callable[[], bool],
        waiter: waiting.BlockedCall | None,
        timeout: float | None,
        what: str,
        n: int = 1,
    ) -> waiting.BlockedCall | None:
        """Wait on the store's condition until ``allowed()`` (lock held); returns its BlockedCall.

        Pass the result (``None`` if it never waited) to the call's later waits.

        Raises:
            ClosedError: if the table is or gets closed.
            RateLimiterTimeoutError: if ``allowed()`` stayed false past the deadline.
        """
        while True:
            if self.closed:
                if waiter is not None:
                    waiter.settle()
                raise ClosedError(f"table {self.name!r} is closed")
            if allowed():
                return waiter
            waiter = waiter or self.blocked_call(timeout, what, n)
            if not waiter.wait(allowed):
                waiter.settle()
                raise RateLimiterTimeoutError(self.timeout_message(what, timeout, n))

    def admit(
        self, n: int, waiter: waiting.BlockedCall | None, timeout: float | None
    ) -> waiting.BlockedCall | None:
        """Wait until the rate limiter admits ``n`` inserts (lock held)."""
        limiter, index = self.rate_limiter, self.index
        allowed = lambda: limiter.can_insert(n, index.size)  # noqa: E731
        return self.wait_until(allowed, waiter, timeout, "insert", n)

    def admit_samples(self, n: int, timeout: float | None) -> None:
        """Wait until the rate limiter admits a sample of ``n`` items (lock held).

        Raises:
            ClosedError, RateLimiterTimeoutError: as :meth:`wait_until`.
        """
        limiter, index = self.rate_limiter, self.index
        allowed = lambda: index.size > 0 and limiter.can_sample(n, index.size)  # noqa: E731
        waiter = self.wait_until(allowed, None, timeout, "sample")
        if waiter is not None:
            waiter.settle()

    def can_sample(self, n: int) -> bool:
        """Whether a sample of ``n`` items would proceed now without blocking or failing."""
        size = self.index.size
        return (
            not self.closed
            and size > 0
            and self.rate_limiter.can_sample(n, size)
            and self.index.sampler.min_probability() > 0
        )

    def can_insert(self, n: int, rows: int) -> bool:
        """Whether ``n`` inserts of ``rows`` new rows would proceed now (lock held)."""
        if self.closed or not self.rate_limiter.can_insert(n, self.index.size):
            return False
        if rows == 0:
            return True
        try:
            return rows <= self.store.capacity and self.store.overwrite.has_room(rows)
        except InvalidArgumentError:  # the store is too small for what writers retain
            return False
