"""Checks of a table's parts that reject configurations before anything is built.

Each error names the argument, the value and what to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.layout import ItemLayout
from rlreplay.core.rate_limiters import RateLimiter
from rlreplay.core.selectors import Selector
from rlreplay.core.specs import Signature
from rlreplay.core.storage import StepStore
from rlreplay.errors import DeadlockError, InvalidArgumentError, check_count, describe

OVERWRITE_POLICIES = ("evict", "block", "relocate")


def resolve_store(
    signature: Mapping[str, Any] | Signature | None,
    capacity: int | None,
    store: StepStore | None,
    max_size: int | None,
) -> StepStore:
    """The table's store: ``store``, or a new one of ``capacity`` steps for ``signature``.

    Raises:
        InvalidArgumentError: when neither or both disagree, or no size is given.
    """
    if store is None:
        if signature is None:
            raise InvalidArgumentError(
                "give either store= (to share steps) or signature= (to own a store)"
            )
        if capacity is None and max_size is not None:
            check_max_size(max_size)  # before it becomes the store's capacity
        size = capacity if capacity is not None else max_size
        if size is None:
            raise InvalidArgumentError("give capacity= or max_size= with signature=")
        return StepStore(signature, size)
    if signature is not None and Signature(signature) != store.signature:
        raise InvalidArgumentError("signature= differs from store.signature; pass one")
    return store


def check_max_size(max_size: Any) -> None:
    """Validate ``max_size`` on its own: a positive int below 2**31.

    Raises:
        InvalidArgumentError: naming max_size and its value.
    """
    if (
        not isinstance(max_size, (int, np.integer))
        or isinstance(max_size, bool)
        or not 1 <= max_size < 2**31
    ):
        raise InvalidArgumentError(
            f"max_size={describe(max_size)} must be a positive int below 2**31: the most "
            "items the table holds (its store gets max_size steps unless capacity= is given)"
        )


def check_table_limits(
    store: StepStore,
    layout: ItemLayout,
    max_size: Any,
    max_times_sampled: Any,
    on_overwrite: Any,
    default_priority: Any,
) -> int:
    """Validate a table's layout and limits against its store; returns ``max_size``.

    Raises:
        InvalidArgumentError: naming the argument, its value and the constraint.
    """
    if layout.signature != store.signature:
        raise InvalidArgumentError("layout was built for another signature than the store's")
    if layout.span * store.lanes > store.capacity:
        raise InvalidArgumentError(
            f"items span {layout.span} steps, more than the store's "
            f"{store.capacity // store.lanes} steps per lane; enlarge the store"
        )
    cap = store.capacity
    size = cap if max_size is None else max_size
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or not 1 <= size <= cap:
        raise InvalidArgumentError(
            f"max_size={describe(max_size)} must be an int in [1, {cap}]: a table holds "
            "at most one item per stored step"
        )
    check_count(max_times_sampled, "max_times_sampled", "0: no limit", minimum=0)
    if on_overwrite not in OVERWRITE_POLICIES:
        raise InvalidArgumentError(
            f"on_overwrite={on_overwrite!r} is unknown; choose one of {OVERWRITE_POLICIES}"
        )
    if on_overwrite == "relocate" and store.lanes != 1:
        raise InvalidArgumentError(
            f"on_overwrite='relocate' needs a single-lane store; this one has lanes={store.lanes}"
        )
    if default_priority is not None:
        check_priorities(default_priority, 1, "default_priority")
    return int(size)


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
        DeadlockError: when the rate limiter could never let a sample through.
    """
    for role, selector in (("sampler", sampler), ("remover", remover)):
        if isinstance(selector, type) or not isinstance(selector, Selector):
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


def check_batch_size(batch_size: Any, max_size: int, name: str = "batch_size") -> int:
    """A sample's ``batch_size`` (the argument ``name``) as an int in ``[1, max_size]``.

    Raises:
        InvalidArgumentError: for a bool, a non-integer or a size outside that range.
    """
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, (int, np.integer))
        or not 1 <= batch_size <= max_size
    ):
        raise InvalidArgumentError(
            f"{name}={describe(batch_size)} must be an int in [1, max_size={max_size}]"
        )
    return int(batch_size)


def int_array(values: Any, name: str) -> np.ndarray:
    """``values`` (ints, one or a sequence) as a flat int64 array.

    Raises:
        InvalidArgumentError: naming ``name`` for anything but ints (floats included).
    """
    try:
        arr = np.asarray(values).reshape(-1)
    except (TypeError, ValueError):
        arr = np.zeros(1, dtype=object)
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and len(arr) == 0):
        raise InvalidArgumentError(f"{name}={describe(values)} must be ints")
    return arr.astype(np.int64, copy=False)


def seeded_rng(seed: Any) -> np.random.Generator:
    """``np.random.default_rng(seed)`` for a ``seed`` given by a user.

    Raises:
        InvalidArgumentError: for a seed that is not None or an int >= 0.
    """
    if seed is not None:
        check_count(seed, "seed", "or None for a fresh random seed", minimum=0)
    return np.random.default_rng(seed)
