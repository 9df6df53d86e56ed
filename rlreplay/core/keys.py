"""Item keys: 64-bit ids that say where an item lives and which occupant it was.

``key = generation << 32 | slot``. A slot's generation steps with every new item there
(cycling through ``1 .. GENERATIONS = 2**31 - 1``; 0: never used), so a key kept after its
item left is *stale*: updates and deletes skip and count it, unless the slot was reused a
multiple of ``2**31 - 1`` times since. Each table's generations start at its own origin
(random, or from an int ``seed`` and its name), so another table's key is refused but with
probability about ``count / (2**31 - 1)``, and names a current item with probability at
most ``1 / (2**31 - 1)``. A call refuses all its keys when one is refused; the compiled
loops follow the same rules. The exact guarantee is in docs/tables.md (Keys).
"""

from __future__ import annotations

import hashlib
import numbers
import secrets

import numpy as np

from rlreplay.core.value_casting import as_array
from rlreplay.errors import InvalidArgumentError, describe

SLOT_BITS = 32
SLOT_MASK = (1 << SLOT_BITS) - 1
GENERATION_MASK = (1 << 31) - 1
GENERATIONS = GENERATION_MASK  # generations run 1 .. GENERATIONS, then 1 again
CYCLED = 1 << 31  # flag in a slot's generation field: its generation has gone round


def generation_origin(seed: object, name: str) -> int:
    """A table's generation origin: from an int ``seed`` and ``name``, else random."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        digest = hashlib.blake2b(
            f"{int(seed)}\0{name}".encode(), digest_size=8, person=b"rlreplay.keys"
        ).digest()
        return int.from_bytes(digest, "little") % GENERATIONS
    return secrets.randbelow(GENERATIONS)


def make_keys(slots: np.ndarray, fields: np.ndarray, origin: int = 0) -> np.ndarray:
    """Keys of the items in ``slots`` from their generation fields, for table origin ``origin``."""
    gens = (fields.astype(np.int64) & GENERATION_MASK) + origin
    if origin:
        gens -= GENERATIONS * (gens > GENERATIONS)
    return (gens << SLOT_BITS) | slots.astype(np.int64)


def relative_generations(generations: np.ndarray, origin: int) -> np.ndarray:
    """Item counts (1 .. GENERATIONS) that key ``generations`` stand for; 0 for generation 0."""
    rel = generations - origin
    rel += GENERATIONS * (rel <= 0)
    return np.where(generations < 1, 0, rel)


def next_generations(fields: np.ndarray) -> np.ndarray:
    """Slots' generation fields after a new item takes each (``CYCLED`` set on wrap)."""
    fields = np.asarray(fields, dtype=np.uint32)
    wraps = (fields & np.uint32(GENERATION_MASK)) == np.uint32(GENERATIONS)
    return np.where(wraps, np.uint32(CYCLED | 1), fields + np.uint32(1)).astype(np.uint32)


def next_generation(field: int) -> int:
    """:func:`next_generations` for one slot's field, as a Python int."""
    return CYCLED | 1 if field & GENERATION_MASK == GENERATIONS else field + 1


def unissued(generations: np.ndarray, fields: np.ndarray) -> np.ndarray:
    """Which item counts ``generations`` the slots can never have issued."""
    fields = fields.astype(np.int64)
    fresh = (fields & CYCLED) == 0
    return (generations < 1) | (fresh & (generations > (fields & GENERATION_MASK)))


def current_generations(fields: np.ndarray) -> np.ndarray:
    """The current generation (int64) of slots with generation ``fields``."""
    return fields.astype(np.int64) & GENERATION_MASK


def key_array(keys: object, argument: str = "keys") -> np.ndarray:
    """``keys`` as a 1-d int64 array.

    Raises:
        InvalidArgumentError: if ``keys`` is not an integer scalar or 1-d integer array.
    """
    arr = as_array(keys, argument)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise InvalidArgumentError(
            f"{argument} must be a 1-d array of int64 item keys (as in Sample.info.keys), "
            f"got {describe(arr)}"
        )
    return arr.astype(np.int64, copy=False)


def split_keys(keys: object, capacity: int, argument: str = "keys") -> tuple[np.ndarray, ...]:
    """Validate ``keys`` and return ``(keys, slots, generations)`` as int64 arrays.

    Raises:
        InvalidArgumentError: if ``keys`` is not a 1-d integer array or names a slot that
            no table of this capacity has.
    """
    arr = key_array(keys, argument)
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
        InvalidArgumentError: on non-numbers, a wrong length, NaN, infinity or a negative value.
    """
    try:
        p = as_array(priorities, argument) if priorities is not None else None
    except InvalidArgumentError:  # a tensor numpy cannot read, named
        raise
    except (TypeError, ValueError):  # e.g. ragged lists
        p = None
    numbers = p is not None and p.dtype.kind in "iuf"  # not strings, bools or objects
    p = p.astype(np.float64, copy=False) if numbers else None  # type: ignore[union-attr]
    if p is None or p.ndim > 1:
        raise InvalidArgumentError(
            f"{argument} must be a number or a 1-d array of {n} numbers, got {describe(priorities)}"
        )
    if p.ndim == 0:
        p = np.full(n, float(p))
    if len(p) != n:
        raise InvalidArgumentError(f"{argument} has {len(p)} value(s) for {n} item(s); give {n}")
    if not np.isfinite(p).all() or (p < 0).any():
        bad = p[~np.isfinite(p) | (p < 0)]
        raise InvalidArgumentError(
            f"{argument} contains {describe(bad[:4].tolist())}; priorities must be finite "
            "and >= 0 (e.g. abs(td_error) + 1e-6)"
        )
    return p


_MARK_ABOVE = 65536  # slots beyond which has_duplicates marks instead of sorting


def has_duplicates(slots: np.ndarray, capacity: int | None = None) -> bool:
    """Whether any slot occurs twice: by sorting, or (many slots) by marking."""
    if len(slots) < 2:
        return False
    if capacity is not None and len(slots) > _MARK_ABOVE:
        seen = np.zeros(capacity, dtype=bool)
        seen[slots] = True
        return int(np.count_nonzero(seen)) != len(slots)
    ordered = np.sort(slots)
    return bool((ordered[1:] == ordered[:-1]).any())
