"""Rate limiters: keep sampling and inserting at a chosen ratio by blocking one side.

The limiter holds only counters; the table owns the lock and the waiting. The rule,
Reverb's, is in docs/tables.md.
"""

from __future__ import annotations

import math
from typing import Any

from rlreplay.errors import DeadlockError, InvalidArgumentError, check_count, describe


class RateLimiter:
    """Reverb's rate-limiting rule over ``diff = inserts * samples_per_insert - samples``.

    Args:
        samples_per_insert: samples (items) expected per inserted item, > 0.
        min_size_to_sample: items the table must hold before any sample proceeds, >= 1.
        min_diff: lowest allowed ``diff`` after a sample.
        max_diff: highest allowed ``diff`` after an insert.

    Raises:
        InvalidArgumentError: for non-positive ratios, ``min_size_to_sample < 1`` or
            ``min_diff > max_diff``.
        DeadlockError: when ``max_diff - min_diff < samples_per_insert`` (both would wait forever).

    Example:
        >>> limiter = RateLimiter(samples_per_insert=4.0, min_size_to_sample=100,
        ...                       min_diff=300.0, max_diff=500.0)
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        min_diff: float,
        max_diff: float,
    ):
        if not (isinstance(samples_per_insert, (int, float)) and samples_per_insert > 0):
            raise InvalidArgumentError(
                f"samples_per_insert={describe(samples_per_insert)} must be a number > 0"
            )
        min_size_to_sample = check_count(min_size_to_sample, "min_size_to_sample")
        if math.isnan(min_diff) or math.isnan(max_diff) or min_diff > max_diff:
            raise InvalidArgumentError(
                f"min_diff={min_diff} and max_diff={max_diff}: min_diff must be <= max_diff"
            )
        if max_diff - min_diff < samples_per_insert:
            raise DeadlockError(
                f"max_diff - min_diff = {max_diff - min_diff} is below samples_per_insert="
                f"{samples_per_insert}: once inserts stop at max_diff no sample can reach "
                "min_diff, and both sides would wait forever; widen the gap (e.g. a larger "
                "error_buffer)"
            )
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = int(min_size_to_sample)
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)
        self.inserts = 0
        self.samples = 0
        self.insert_blocked_s = 0.0
        self.sample_blocked_s = 0.0

    def can_insert(self, n: int, size: int) -> bool:
        """Whether inserting ``n`` items into a table holding ``size`` may proceed now."""
        if size + n <= self.min_size_to_sample:
            return True
        return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

    def can_sample(self, n: int, size: int) -> bool:
        """Whether sampling ``n`` items from a table holding ``size`` may proceed now."""
        if size < self.min_size_to_sample:
            return False
        return self.inserts * self.samples_per_insert - (self.samples + n) >= self.min_diff

    def check_sample_batch(self, n: int, size: int = 0) -> None:
        """Reject a sample batch this limiter could never let through from its current state.

        Raises:
            DeadlockError: if ``n`` exceeds the largest batch the limiter can ever admit.
        """
        spi = self.samples_per_insert
        diff = self.inserts * spi - self.samples
        ceiling = max(self.max_diff, diff + max(0, self.min_size_to_sample - size) * spi)
        if ceiling - n < self.min_diff and math.isfinite(ceiling - self.min_diff):
            raise DeadlockError(
                f"batch_size={n} can never be sampled: this rate limiter admits at most "
                f"{ceiling - self.min_diff:g} samples between inserts (max_diff - min_diff); "
                "sample smaller batches or widen the limiter's error buffer"
            )

    def check_insert_batch(self, n: int) -> None:
        """Reject an insert batch this limiter could never let through from its current state.

        Raises:
            DeadlockError: if ``n`` items would overshoot ``max_diff`` after every possible sample.
        """
        if n <= self.min_size_to_sample:
            return
        spi = self.samples_per_insert
        floor = min(self.min_diff, self.inserts * spi - self.samples)
        if floor + n * spi > self.max_diff:
            raise DeadlockError(
                f"inserting {n} items at once can never be admitted: this rate limiter "
                f"allows at most {(self.max_diff - floor) / spi:g} inserts ahead of the "
                "samples; insert smaller batches or widen the limiter's error buffer"
            )

    def insert_window(self) -> float:
        """The most items one insert may hold and be admitted from every state a writer waits in.

        Writers that split inserts into batches of this size never deadlock.

        Returns:
            an int >= 1, or ``math.inf`` (inserts never block).
        """
        spi = self.samples_per_insert
        window = min(
            (self.max_diff - self.min_diff) / spi,
            self.max_diff / spi - self.min_size_to_sample + 1,
        )
        if not math.isfinite(window):
            return math.inf
        return max(1, int(window))

    def reset(self) -> None:
        self.inserts = 0
        self.samples = 0

    def state(self) -> dict[str, Any]:
        return {
            "inserts": self.inserts,
            "samples": self.samples,
            "insert_blocked_s": self.insert_blocked_s,
            "sample_blocked_s": self.sample_blocked_s,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.inserts = int(state["inserts"])
        self.samples = int(state["samples"])
        self.insert_blocked_s = float(state["insert_blocked_s"])
        self.sample_blocked_s = float(state["sample_blocked_s"])

    def config(self) -> dict[str, Any]:
        return {
            "samples_per_insert": self.samples_per_insert,
            "min_size_to_sample": self.min_size_to_sample,
            "min_diff": self.min_diff,
            "max_diff": self.max_diff,
        }

    def __repr__(self) -> str:
        c = self.config()
        return "RateLimiter(" + ", ".join(f"{k}={v:g}" for k, v in c.items()) + ")"


def insert_pack(window: float) -> float:
    """Items a writer puts in one insert under ``window``: half, so inserts and samples overlap."""
    if not math.isfinite(window):
        return window
    return max(1, int(window) // 2)


def MinSize(min_size_to_sample: int = 1) -> RateLimiter:
    """Block sampling until the table holds ``min_size_to_sample`` items; never block inserts."""
    return RateLimiter(1.0, min_size_to_sample, -math.inf, math.inf)


def SampleToInsertRatio(
    samples_per_insert: float, min_size_to_sample: int, error_buffer: float
) -> RateLimiter:
    """Hold ``samples / inserts`` near ``samples_per_insert`` once the table is big enough.

    ``diff`` may wander ``error_buffer`` either side of ``min_size_to_sample *
    samples_per_insert``; the side that gets ahead blocks, so both sides must keep running.

    Args:
        samples_per_insert: samples wanted per inserted item.
        min_size_to_sample: items the table holds before any sample.
        error_buffer: the drift allowed either side, in samples; a sample batch larger than
            ``2 * error_buffer`` can never go through (DeadlockError when it is asked).

    Raises:
        DeadlockError: if ``error_buffer`` is below ``max(1, samples_per_insert) / 2``.
    """
    if not isinstance(error_buffer, (int, float)) or not error_buffer >= 0:
        raise InvalidArgumentError(f"error_buffer={describe(error_buffer)} must be a number >= 0")
    if isinstance(samples_per_insert, (int, float)) and 2 * error_buffer < max(
        1.0, samples_per_insert
    ):
        raise DeadlockError(
            f"error_buffer={error_buffer} is too small for samples_per_insert="
            f"{samples_per_insert}: it must be at least max(1, samples_per_insert) / 2 or "
            "inserts and samples can block each other forever"
        )
    min_size_to_sample = check_count(min_size_to_sample, "min_size_to_sample")
    offset = samples_per_insert * min_size_to_sample
    return RateLimiter(
        samples_per_insert, min_size_to_sample, offset - error_buffer, offset + error_buffer
    )


def Queue(size: int) -> RateLimiter:
    """Each item is sampled once: inserts block when ``size`` items wait, samples when none do.

    A sampler must consume the queue, or inserts stop once ``size`` items wait.
    """
    return RateLimiter(1.0, 1, 0.0, float(check_count(size, "size")))


def Stack(size: int) -> RateLimiter:
    """The :func:`Queue` rule for a stack: at most ``size`` items wait, each sampled once."""
    return Queue(size)
