"""Checks of a table's parts that reject configurations before anything is built.

Each check names the argument, the value and what to change; the deadlock checks explain
why the combination could never make progress.
"""

from __future__ import annotations

from rlreplay.core.rate_limiters import RateLimiter
from rlreplay.core.selectors import Selector
from rlreplay.errors import DeadlockError, InvalidArgumentError, describe


def check_components(
    sampler: object,
    remover: object,
    rate_limiter: object,
    max_size: int,
    max_times_sampled: int,
) -> None:
    """Validate a table's sampler, remover and rate limiter against its limits.

    Raises:
        InvalidArgumentError: for a part of the wrong type or one selector in both roles.
        DeadlockError: when the rate limiter could never let a sample through with this
            ``max_size`` or ``max_times_sampled``.
    """
    for role, selector in (("sampler", sampler), ("remover", remover)):
        if not isinstance(selector, Selector):
            raise InvalidArgumentError(
                f"{role}={describe(selector)} is not a selector instance; give e.g. "
                f"{role}=Uniform() or {role}=Prioritized(0.6)"
            )
    if sampler is remover:
        raise InvalidArgumentError(
            "sampler and remover are the same object; give each its own instance"
        )
    if not isinstance(rate_limiter, RateLimiter):
        raise InvalidArgumentError(
            f"rate_limiter={describe(rate_limiter)} is not a RateLimiter; give e.g. "
            "MinSize(1) or SampleToInsertRatio(samples_per_insert, min_size_to_sample, "
            "error_buffer)"
        )
    if rate_limiter.min_size_to_sample > max_size:
        raise DeadlockError(
            f"rate_limiter needs min_size_to_sample={rate_limiter.min_size_to_sample} "
            f"items before any sample, but max_size={max_size} caps the table below "
            "that, so every sample would wait forever; raise max_size or lower "
            "min_size_to_sample"
        )
    spi = rate_limiter.samples_per_insert
    if 0 < max_times_sampled < spi and rate_limiter.max_diff < float("inf"):
        raise DeadlockError(
            f"rate_limiter wants samples_per_insert={spi:g} samples per item, but "
            f"max_times_sampled={max_times_sampled} removes each item sooner, so inserts "
            "would stop at max_diff while samples wait on an empty table; raise "
            "max_times_sampled or lower samples_per_insert"
        )


def check_timeout(timeout: float | None) -> float | None:
    """Validate a ``timeout`` in seconds (``None``: no limit).

    Raises:
        InvalidArgumentError: for a non-number or a value <= 0.
    """
    if timeout is None:
        return None
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(
            f"timeout={describe(timeout)} must be a number of seconds > 0, or None to wait "
            "without limit; use can_insert()/can_sample() to check without waiting"
        )
    return float(timeout)
