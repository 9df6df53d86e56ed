"""A step store's columns: how many rows they hold, and the arrays that hold them.

Columns are made (zeroed, after a memory check) or given (a checkpoint's memory-mapped
files) and checked, before the store changes anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core import memory
from rlreplay.core.specs import Signature
from rlreplay.errors import InvalidArgumentError, describe


def store_capacity(
    signature: Signature, capacity: Any, lanes: Any, capacity_bytes: Any
) -> tuple[int, int]:
    """``(capacity, lanes)`` of a store with these arguments, checked.

    Raises:
        InvalidArgumentError: for bad ``lanes``, neither or both of ``capacity`` and
            ``capacity_bytes``, or a ``capacity`` that is not a positive multiple of ``lanes``
            below 2**31.
    """
    if not isinstance(lanes, (int, np.integer)) or lanes < 1 or lanes > 65535:
        raise InvalidArgumentError(f"lanes={describe(lanes)} must be an int in [1, 65535]")
    if (capacity is None) == (capacity_bytes is None):
        raise InvalidArgumentError(
            "give one of capacity= (steps) or capacity_bytes= (bytes of the columns)"
        )
    if capacity_bytes is not None:
        capacity = memory.rows_for_bytes(
            capacity_bytes, signature.step_nbytes, lanes, "capacity_bytes"
        )
    if (
        not isinstance(capacity, (int, np.integer))
        or capacity < 1
        or capacity % lanes
        or capacity >= 2**31
    ):
        raise InvalidArgumentError(
            f"capacity={describe(capacity)} must be a positive int below 2**31 and a "
            f"multiple of lanes={lanes}"
        )
    return int(capacity), int(lanes)


def new_columns(
    owner: Any, signature: Signature, capacity: int, capacity_bytes: int | None
) -> dict[str, np.ndarray]:
    """One zeroed array of ``(capacity, *shape)`` per field, counted while ``owner`` lives.

    Raises:
        InsufficientMemoryError: if they do not fit; nothing is allocated.
    """
    row_bytes = signature.step_nbytes
    memory.check_fits(
        owner,
        capacity * row_bytes,
        f"a step store of {capacity} steps of {row_bytes} bytes",
        "lower capacity=, or give capacity_bytes= (a byte budget resolved to steps)"
        if capacity_bytes is None
        else f"lower capacity_bytes={capacity_bytes} to what is available",
    )
    return {
        path: np.zeros((capacity, *spec.shape), dtype=spec.dtype)
        for path, spec in signature.fields.items()
    }


def checked_columns(
    signature: Signature, capacity: int, columns: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``columns`` in field order, each checked to be ``(capacity, *shape)`` of its dtype.

    Raises:
        InvalidArgumentError: naming the first column that does not match.
    """
    for path, spec in signature.fields.items():
        col = columns.get(path)
        want = (capacity, *spec.shape)
        if col is None or col.shape != want or col.dtype != spec.dtype:
            raise InvalidArgumentError(
                f"column {path!r} is {describe(col)}; it must be an array of shape "
                f"{want} and dtype {spec.dtype}"
            )
    return {path: columns[path] for path in signature.fields}
