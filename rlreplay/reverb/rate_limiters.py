"""Reverb's rate limiters, validating their arguments as Reverb does (``ValueError``).

Each is a description (``samples_per_insert``, ``min_size_to_sample``, ``min_diff``,
``max_diff``); a table builds a fresh :class:`rlreplay.RateLimiter` from it, which applies
the same rule (see :mod:`rlreplay.core.rate_limiters`).
"""

from __future__ import annotations

import logging
import sys

import rlreplay as _rr
from rlreplay.errors import describe
from rlreplay.reverb.errors import InvalidArgumentError, is_int

__all__ = ["MinSize", "Queue", "RateLimiter", "SampleToInsertRatio", "Stack"]

log = logging.getLogger("rlreplay.reverb")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{name}={describe(value)} must be a number")
    return float(value)


def _count(name: str, value: object) -> int:
    if not is_int(value) or value < 1:
        raise InvalidArgumentError(
            f"min_size_to_sample ({describe(value)}) must be a positive integer"
            if name == "min_size_to_sample"
            else f"{name}={describe(value)} must be a positive integer"
        )
    return int(value)


class RateLimiter:
    """Reverb's rate-limiting rule with explicit bounds.

    Args:
        samples_per_insert: samples expected per inserted item (> 0).
        min_size_to_sample: items a table must hold before any sample (>= 1).
        min_diff: lowest ``inserts * samples_per_insert - samples`` a sample may leave.
        max_diff: highest such value an insert may leave.

    Raises:
        InvalidArgumentError (a ValueError): naming the argument, for values the rule
            refuses (as rlreplay's :class:`rlreplay.RateLimiter` does).
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        min_diff: float,
        max_diff: float,
    ):
        self._samples_per_insert = _number("samples_per_insert", samples_per_insert)
        self._min_size_to_sample = _count("min_size_to_sample", min_size_to_sample)
        self._min_diff = _number("min_diff", min_diff)
        self._max_diff = _number("max_diff", max_diff)
        self.build()  # refuses what rlreplay's rule refuses, now rather than at the table

    @property
    def samples_per_insert(self) -> float:
        return self._samples_per_insert

    @property
    def min_size_to_sample(self) -> int:
        return self._min_size_to_sample

    @property
    def min_diff(self) -> float:
        return self._min_diff

    @property
    def max_diff(self) -> float:
        return self._max_diff

    def build(self) -> _rr.RateLimiter:
        """A fresh rlreplay limiter with these bounds (each table counts for itself)."""
        return _rr.RateLimiter(
            self._samples_per_insert, self._min_size_to_sample, self._min_diff, self._max_diff
        )

    def info(self) -> dict[str, float]:
        return {
            "samples_per_insert": self._samples_per_insert,
            "min_size_to_sample": self._min_size_to_sample,
            "min_diff": self._min_diff,
            "max_diff": self._max_diff,
        }

    def __repr__(self) -> str:
        return (
            f"RateLimiter(samples_per_insert={self._samples_per_insert}, "
            f"min_size_to_sample={self._min_size_to_sample}, min_diff={self._min_diff}, "
            f"max_diff={self._max_diff})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RateLimiter) and other.info() == self.info()

    def __hash__(self) -> int:
        return hash(tuple(self.info().items()))


class MinSize(RateLimiter):
    """Samples wait until the table holds ``min_size_to_sample`` items; inserts never wait.

    Raises:
        InvalidArgumentError (a ValueError): if ``min_size_to_sample < 1``.
    """

    def __init__(self, min_size_to_sample: int):
        super().__init__(
            1.0,
            _count("min_size_to_sample", min_size_to_sample),
            -sys.float_info.max,
            sys.float_info.max,
        )


class SampleToInsertRatio(RateLimiter):
    """Keeps ``samples / inserts`` near ``samples_per_insert`` once the table holds
    ``min_size_to_sample`` items, within ``error_buffer`` (a number: a range of that
    half-width around ``min_size_to_sample * samples_per_insert``; a pair: the range).

    Raises:
        InvalidArgumentError (a ValueError): as Reverb: ``samples_per_insert <= 0``, a range
            narrower than ``2 * max(1, samples_per_insert)``, a range entirely above
            ``min_size_to_sample * samples_per_insert`` (a deadlock once that many items
            are in), or ``min_size_to_sample < 1``. A range entirely below it is logged as
            a warning, as Reverb does.
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        error_buffer: float | tuple[float, float],
    ):
        spi = _number("samples_per_insert", samples_per_insert)
        if isinstance(error_buffer, (int, float)) and not isinstance(error_buffer, bool):
            offset = spi * min_size_to_sample
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        elif isinstance(error_buffer, (tuple, list)) and len(error_buffer) == 2:
            min_diff, max_diff = (_number("error_buffer", v) for v in error_buffer)
        else:
            raise InvalidArgumentError(
                f"error_buffer={describe(error_buffer)} must be a number or a (min, max) pair"
            )
        if spi <= 0:
            raise InvalidArgumentError(
                f"samples_per_insert ({describe(samples_per_insert)}) must be > 0"
            )
        if max_diff - min_diff < 2 * max(1.0, spi):
            raise InvalidArgumentError(
                f"error_buffer={error_buffer!r}: the size of error_buffer must be >= "
                "max(1.0, samples_per_insert) as smaller values could completely block "
                "samples and/or insert calls"
            )
        if is_int(min_size_to_sample) and max_diff < spi * min_size_to_sample:
            log.warning(
                "The range covered by error_buffer is below samples_per_insert * "
                "min_size_to_sample. If the sampler cannot sample concurrently, this will "
                "result in a deadlock as soon as min_size_to_sample items have been inserted."
            )
        if is_int(min_size_to_sample) and min_diff > spi * min_size_to_sample:
            raise InvalidArgumentError(
                f"error_buffer={error_buffer!r}: the range covered by error_buffer is above "
                "samples_per_insert * min_size_to_sample; this would deadlock as soon as "
                "min_size_to_sample items have been inserted"
            )
        super().__init__(spi, _count("min_size_to_sample", min_size_to_sample), min_diff, max_diff)


class Queue(RateLimiter):
    """Each item sampled once, inserts wait while ``size`` items wait (use
    ``Table.queue``, with Fifo sampler and remover)."""

    def __init__(self, size: int):
        super().__init__(1.0, 1, 0.0, float(_count("size", size)))


class Stack(RateLimiter):
    """As :class:`Queue`, for ``Table.stack`` (Lifo sampler and remover)."""

    def __init__(self, size: int):
        super().__init__(1.0, 1, 0.0, float(_count("size", size)))


def check_rate_limiter(value: object) -> RateLimiter:
    if not isinstance(value, RateLimiter):
        raise InvalidArgumentError(
            f"rate_limiter={describe(value)} must be a rate limiter of "
            "rlreplay.reverb.rate_limiters (MinSize(n), SampleToInsertRatio(...), ...)"
        )
    return value
