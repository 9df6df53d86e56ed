"""Which held items a batch of keys names: the lookup behind priority updates and deletes.

Stale keys are counted, keys never issued refused; ``_slots.c`` and the numpy path here
are twins.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core.keys import (
    check_priorities,
    current_generations,
    has_duplicates,
    relative_generations,
    split_keys,
    unissued,
)
from rlreplay.core.slot_records import SlotRecords
from rlreplay.errors import InvalidArgumentError, describe


def held(
    kernel: Any,
    records: SlotRecords,
    origin: int,
    keys: Any,
    priorities: Any,
    deleting: bool,
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """``(slots, priorities, stale)`` of the held items ``keys`` name.

    Args:
        kernel: the compiled ``_slots`` module, or ``None`` for the numpy path.
        records: the table's per-slot records.
        origin: the table's generation origin (keys.py).

    Raises:
        InvalidArgumentError: for keys this table never issued or invalid priorities.
    """
    if (
        kernel is not None
        and type(keys) is np.ndarray
        and keys.dtype == np.int64
        and keys.ndim == 1
        and keys.flags.c_contiguous
    ):
        n = len(keys)
        values = None
        if not deleting and type(priorities) is np.ndarray:
            values = np.ascontiguousarray(priorities, dtype=np.float64)
        if deleting or (values is not None and values.shape == (n,)):
            out_slots = np.empty(n, dtype=np.int64)
            out_values = None if deleting else np.empty(n)
            found = kernel.held_slots(
                keys, records.slot_bytes, records.live, values, out_slots, out_values, origin
            )
            if found is not None:  # else a bad entry: the path below names it
                kept, stale = found
                return out_slots[:kept], None if deleting else out_values[:kept], stale
    keys, slots, gens = split_keys(keys, records.capacity)
    prios = None if deleting else check_priorities(priorities, len(keys))
    return current(records, origin, keys, slots, gens, prios)


def current(
    records: SlotRecords,
    origin: int,
    keys: np.ndarray,
    slots: np.ndarray,
    gens: np.ndarray,
    values: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The numpy path of :func:`held`, for keys already split into slots and generations.

    Raises:
        InvalidArgumentError: for a key this table never issued.
    """
    fields = records.generation[slots]
    gens = relative_generations(gens, origin)
    never = unissued(gens, fields)
    if never.any():
        raise InvalidArgumentError(
            f"keys contains {describe(keys[never][:4].tolist())}, which are not keys of "
            "this table (it never issued them: keys of another table, or made up); pass "
            "keys taken from this table's samples or inserts"
        )
    is_held = records.live[slots] & (current_generations(fields) == gens)
    n_held = int(np.count_nonzero(is_held))
    stale = len(slots) - n_held
    if stale:
        slots = slots[is_held]
        values = None if values is None else values[is_held]
    if len(slots) > 1 and has_duplicates(slots):
        order = np.argsort(slots, kind="stable")
        ordered = slots[order]
        last = np.empty(len(slots), dtype=bool)
        last[-1] = True
        np.not_equal(ordered[1:], ordered[:-1], out=last[:-1])
        keep = order[last]  # the last occurrence of each slot, in slot order
        slots = slots[keep]
        values = None if values is None else values[keep]
    return slots, values, stale
