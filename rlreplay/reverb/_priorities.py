"""Priorities of Reverb items: what ``insert``, the writers' ``create_item`` and
``mutate_priorities`` take (numbers, numpy scalars and 0-d arrays; finite, >= 0)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from rlreplay.errors import describe
from rlreplay.reverb.errors import InvalidArgumentError

_INF = float("inf")
_NUMBERS = frozenset({int, float, np.float64, np.float32, np.int64, np.int32})


def checked_priority(priority: Any, table: str) -> float:
    """``priority`` as a float, for an item of ``table``.

    Raises:
        InvalidArgumentError: for anything but a finite number >= 0 (a bool or a string
            included).
    """
    if type(priority) is float and 0.0 <= priority < _INF:  # the common case
        return priority
    if not isinstance(priority, (str, bytes)):  # (numpy would read numbers in them)
        arr = np.asarray(priority)  # numbers, numpy scalars and 0-d arrays
        if arr.ndim == 0 and arr.dtype.kind in "iuf" and 0.0 <= float(arr) < _INF:
            return float(arr)
    raise InvalidArgumentError(
        f"priority={describe(priority)} for table {table!r} must be a finite number >= 0"
    )


def checked_priorities(priorities: Iterable[Any], table: str) -> np.ndarray:
    """``priorities`` as float64, each as :func:`checked_priority` takes it (the common
    case, Python or numpy numbers, checked as one array).

    Raises:
        InvalidArgumentError: naming the first priority that is not a finite number >= 0.
    """
    values = list(priorities)
    if set(map(type, values)) <= _NUMBERS:
        out = np.fromiter(values, np.float64, len(values))
        if np.isfinite(out).all() and (out >= 0).all():
            return out
    return np.fromiter((checked_priority(v, table) for v in values), np.float64, len(values))
