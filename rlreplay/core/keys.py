"""Item keys: 64-bit ids that say where an item lives and which occupant it was.

``key = generation << 32 | slot``, always a non-negative int64. A slot's generation steps
to the next value every time a new item takes the slot, so a key kept by a learner after
its item was evicted no longer matches the slot's current generation: priority updates and
deletes with such *stale* keys are skipped and counted instead of hitting the slot's new
occupant.

Generations cycle through ``1 .. GENERATIONS`` (``GENERATIONS = 2**31 - 1``): after
``GENERATIONS`` comes 1 again, and 0 means "no item ever" (no key has generation 0). A key
therefore never goes negative, however often its slot is reused, and the guarantee is:

    A key is recognised as stale unless its slot was reused a multiple of
    ``2**31 - 1`` times since the key was issued.

(At one new item per slot every microsecond that is 36 minutes of reuse of one slot
between issuing a key and using it, far beyond any learner's delay.)

The per-slot record holds the generation in a 32-bit field (``SLOT_STATE`` in item_index.py):
its low 31 bits count the slot's items (1 .. GENERATIONS, then 1 again; 0: none yet), and
its top bit (:data:`CYCLED`) is set once that count has gone round.

Keys of different tables. Every table draws a *generation origin* ``o`` in
``0 .. GENERATIONS - 1`` when it is built, and the key of a slot's ``g``-th item carries
generation ``(g - 1 + o) % GENERATIONS + 1`` (:func:`make_keys`), so two tables issue
different keys for the same slot and item count. The origin comes from ``secrets`` (the
operating system's random source) for a table without ``seed``; with an int ``seed`` it is
derived from the seed and the table's name (:func:`generation_origin`), so a seeded run
issues the same keys every time, and tables with one seed but different names still get
different origins. (Two tables with the same name and the same seed share their origin:
their keys cannot be told apart.)

A key names a slot and an item count ``g`` (:func:`relative_generations`). It is refused
with :class:`InvalidArgumentError` ("not a key of this table") when its slot is outside the
table, its generation is 0, or ``g`` is beyond the slot's count while the slot has not
cycled, i.e. its generation lies outside the window ``(o, o + count]`` (mod GENERATIONS)
this table issued for that slot; a key in the window but not the slot's current item is
stale (skipped and counted). The guarantee for a key of *another* table (whose origin was
drawn independently, or derived from another seed or name) used on this one: its item
count here is uniform over ``1 .. GENERATIONS``, so it

* is refused with probability ``1 - count / (2**31 - 1)`` (for a slot that has held
  ``count`` items and not cycled; 1 for a slot this table never used, almost 1 for any
  slot reused fewer than millions of times),
* is counted as stale with probability at most ``(count - 1) / (2**31 - 1)``, and
* is mistaken for this table's current item in that slot with probability at most
  ``1 / (2**31 - 1)`` (about 4.7e-10) per key; that is the only case in which it changes
  anything.

A call refuses all its keys when one is refused (``update_priorities``/``delete`` change
nothing then), so a batch of ``k`` foreign keys changes something only if none of them is
refused.

The compiled loops (_slots.c, _draws.c, _common.h) follow the same rules.
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
    """A table's generation origin (0 .. GENERATIONS - 1, see the module docstring): derived
    from ``seed`` and ``name`` when ``seed`` is an int, else drawn from ``secrets``."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        digest = hashlib.blake2b(
            f"{int(seed)}\0{name}".encode(), digest_size=8, person=b"rlreplay.keys"
        ).digest()
        return int.from_bytes(digest, "little") % GENERATIONS
    return secrets.randbelow(GENERATIONS)


def make_keys(slots: np.ndarray, fields: np.ndarray, origin: int = 0) -> np.ndarray:
    """Keys of the items in ``slots`` from their slots' generation fields (the record's
    ``generation``; the :data:`CYCLED` flag is dropped) for a table whose generation
    origin is ``origin``."""
    gens = (fields.astype(np.int64) & GENERATION_MASK) + origin
    if origin:
        gens -= GENERATIONS * (gens > GENERATIONS)
    return (gens << SLOT_BITS) | slots.astype(np.int64)


def relative_generations(generations: np.ndarray, origin: int) -> np.ndarray:
    """The item counts (1 .. GENERATIONS) that key ``generations`` (int64, 0 ..
    GENERATIONS) stand for in a table whose generation origin is ``origin``; 0 for key
    generation 0, which no table issues."""
    rel = generations - origin
    rel += GENERATIONS * (rel <= 0)
    return np.where(generations < 1, 0, rel)


def next_generations(fields: np.ndarray) -> np.ndarray:
    """The generation fields (uint32) of slots whose fields are ``fields`` after a new item
    takes each: the generation steps by one, from GENERATIONS back to 1 with the
    :data:`CYCLED` flag set."""
    fields = np.asarray(fields, dtype=np.uint32)
    wraps = (fields & np.uint32(GENERATION_MASK)) == np.uint32(GENERATIONS)
    return np.where(wraps, np.uint32(CYCLED | 1), fields + np.uint32(1)).astype(np.uint32)


def next_generation(field: int) -> int:
    """:func:`next_generations` for one slot's field, as a Python int."""
    return CYCLED | 1 if field & GENERATION_MASK == GENERATIONS else field + 1


def unissued(generations: np.ndarray, fields: np.ndarray) -> np.ndarray:
    """Which item counts ``generations`` (from :func:`relative_generations`) the slots
    (with generation ``fields``) can never have issued: 0, or beyond the slot's count
    while it has not cycled."""
    fields = fields.astype(np.int64)
    fresh = (fields & CYCLED) == 0
    return (generations < 1) | (fresh & (generations > (fields & GENERATION_MASK)))


def current_generations(fields: np.ndarray) -> np.ndarray:
    """The current generation (int64) of slots with generation ``fields``."""
    return fields.astype(np.int64) & GENERATION_MASK


def key_array(keys: object, argument: str = "keys") -> np.ndarray:
    """``keys`` as a 1-d int64 array (a single key as one element).

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
            no table of this capacity has (it was not produced by this table). The
            generations are the keys' own (see :func:`relative_generations`).
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
        InvalidArgumentError: on a value that is not numbers, a wrong length, NaN,
            infinity or a negative value.
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
    """Whether any slot occurs twice: by sorting (far cheaper than np.unique here), or,
    for more slots than a batch holds that are all below a known ``capacity``, by
    marking them (one pass; sorting a whole index's millions of slots takes seconds)."""
    if len(slots) < 2:
        return False
    if capacity is not None and len(slots) > _MARK_ABOVE:
        seen = np.zeros(capacity, dtype=bool)
        seen[slots] = True
        return int(np.count_nonzero(seen)) != len(slots)
    ordered = np.sort(slots)
    return bool((ordered[1:] == ordered[:-1]).any())
