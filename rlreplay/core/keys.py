"""Item keys: 64-bit ids that say where an item lives and which occupant it was.

``key = generation << 32 | slot``. A slot's generation grows every time a new item takes
it, so a key kept by a learner after its item was evicted no longer matches the slot's
current generation: priority updates and deletes with such *stale* keys are skipped and
counted instead of hitting the slot's new occupant.
"""

from __future__ import annotations

import numpy as np

from rlreplay.errors import InvalidArgumentError, describe

SLOT_BITS = 32
SLOT_MASK = (1 << SLOT_BITS) - 1


def make_keys(slots: np.ndarray, generations: np.ndarray) -> np.ndarray:
    return (generations.astype(np.int64) << SLOT_BITS) | slots.astype(np.int64)


def split_keys(keys: object, capacity: int, argument: str = "keys") -> tuple[np.ndarray, ...]:
    """Validate ``keys`` and return ``(keys, slots, generations)`` as int64 arrays.

    Raises:
        InvalidArgumentError: if ``keys`` is not a 1-d integer array or names a slot that
            no table of this capacity has (it was not produced by this table).
    """
    arr = np.asarray(keys)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise InvalidArgumentError(
            f"{argument} must be a 1-d array of int64 item keys (as in Sample.info.keys), "
            f"got {describe(arr)}"
        )
    arr = arr.astype(np.int64, copy=False)
    slots = arr & SLOT_MASK
    bad = (arr < 0) | (slots >= capacity)
    if bad.any():
        raise InvalidArgumentError(
            f"{argument} contains {describe(arr[bad][:4].tolist())}, which are not keys of "
            "this table; pass keys taken from this table's samples or inserts"
        )
    return arr, slots, arr >> SLOT_BITS


def check_priorities(priorities: object, n: int, argument: str = "priorities") -> np.ndarray:
    """Validate ``n`` priorities: finite and >= 0. Returns a float64 array.

    Raises:
        InvalidArgumentError: on a wrong length, NaN, infinity or a negative value.
    """
    p = np.asarray(priorities, dtype=np.float64) if priorities is not None else None
    if p is None or p.ndim > 1:
        raise InvalidArgumentError(
            f"{argument} must be a number or a 1-d array of {n} numbers, got {describe(priorities)}"
        )
    if p.ndim == 0:
        p = np.full(n, float(p))
    if len(p) != n:
        raise InvalidArgumentError(f"{argument} has {len(p)} values for {n} items; give {n}")
    if not np.isfinite(p).all() or (p < 0).any():
        bad = p[~np.isfinite(p) | (p < 0)]
        raise InvalidArgumentError(
            f"{argument} contains {describe(bad[:4].tolist())}; priorities must be finite "
            "and >= 0 (e.g. abs(td_error) + 1e-6)"
        )
    return p


def has_duplicates(slots: np.ndarray) -> bool:
    """Whether any slot occurs twice (sorting is far cheaper than np.unique here)."""
    if len(slots) < 2:
        return False
    ordered = np.sort(slots)
    return bool((ordered[1:] == ordered[:-1]).any())
