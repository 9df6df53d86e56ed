"""Which values a column takes: one casting rule for every write path.

A value is stored when it converts to its column's dtype without changing in kind or
value, and refused otherwise with a :class:`~rlreplay.errors.SignatureError`; nothing is
wrapped or truncated:

- a bool goes into any numeric column;
- an integer into an integer column whose range holds it, or a float/complex column
  unless it would become inf;
- a float into a float/complex column (rounded) unless finite and beyond its range; never
  into an integer or bool column;
- a complex value only into a complex column;
- other kinds only when numpy casts them safely.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlreplay.errors import InvalidArgumentError, SignatureError, describe


def cast_problem(arr: np.ndarray, dtype: np.dtype) -> str | None:
    """Why ``arr`` may not be stored as ``dtype`` under the module's rule, or ``None``."""
    src = arr.dtype
    if src == dtype:
        return None
    kind, into = src.kind, dtype.kind
    if kind in "iu" and into in "iu" and not np.can_cast(src, dtype):
        if arr.size == 0:
            return None
        info = np.iinfo(dtype)
        low, high = int(arr.min()), int(arr.max())
        if low >= info.min and high <= info.max:
            return None
        bad = low if low < info.min else high
        return f"holds {bad}, outside the range [{info.min}, {info.max}] of its column's {dtype}"
    if kind == "b":
        allowed = into in "biufc"
    elif kind in "iu":
        allowed = into in "iufc"
        if into in "fc" and arr.size:
            return _overflow(arr, dtype)
    elif kind == "f":
        allowed = into in "fc"
        if allowed and arr.size:
            return _overflow(arr, dtype)
    elif kind == "c":
        allowed = into == "c"
        if allowed and arr.size:
            return _overflow(arr, dtype)
    elif kind == "O":
        allowed = False
    else:
        allowed = np.can_cast(src, dtype, casting="safe")
    if allowed:
        return None
    return f"has dtype {src}, which cannot be stored as {dtype} without changing its kind"


def float_fits(value: float, dtype: np.dtype) -> bool:
    """Whether a float or complex column of ``dtype`` holds ``value`` without it becoming inf."""
    limit = _ROUNDING_LIMITS.get(dtype)
    if limit is None:
        parts = np.dtype(dtype.char.lower()) if dtype.kind == "c" else dtype
        big = float(np.finfo(parts).max)
        below = float(np.nextafter(parts.type(big), parts.type(0)))
        # Values from here on round to inf (a tie rounds up: the largest value is odd).
        limit = _ROUNDING_LIMITS[dtype] = big + (big - below) / 2
    return abs(value) < limit or not math.isfinite(value)


# Per float or complex dtype, the magnitude from which a float64 rounds to inf in it.
_ROUNDING_LIMITS: dict[np.dtype, float] = {}


def _overflow(arr: np.ndarray, dtype: np.dtype) -> str | None:
    """Why a finite value of ``arr`` would become inf in ``dtype``, or ``None``."""
    parts = np.dtype(dtype.char.lower()) if dtype.kind == "c" else dtype
    big = float(np.finfo(parts).max)
    if arr.dtype.kind in "iu":
        own = float(np.iinfo(arr.dtype).max)
    else:
        own = float(np.finfo(arr.dtype.char.lower() if arr.dtype.kind == "c" else arr.dtype).max)
    if own <= big:
        return None  # every finite value of arr's dtype fits
    values = arr.reshape(-1)
    if arr.dtype.kind == "c":
        values = values.view(arr.dtype.char.lower())
    if -big <= values.min() and values.max() <= big:  # the common case: one pass each
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        over = np.isfinite(values) & ~np.isfinite(values.astype(parts))
    if not over.any():
        return None
    value = float(values[over].flat[0])
    return f"holds {value:g}, beyond the largest {parts} ({big:g}): it would be stored as inf"


def _python_ints(arr: np.ndarray) -> bool:
    """Whether an object array holds only Python ints (some too large for int64)."""
    return arr.dtype == object and all(type(x) is int for x in arr.flat)


def as_array(value: Any, argument: str, dtype: Any = None) -> np.ndarray:
    """``np.asarray(value, dtype)`` of a value passed as ``argument``, typing tensor errors.

    Raises:
        InvalidArgumentError: naming ``argument``, for a tensor that requires grad or is not
            on the CPU.
        TypeError, ValueError: as numpy raises them for anything else it cannot read.
    """
    try:
        return np.asarray(value, dtype=dtype)
    except (RuntimeError, TypeError) as exc:
        hint = _tensor_hint(value)
        if hint is None:
            raise
        raise InvalidArgumentError(f"{argument}={describe(value)} {hint}") from exc


def _tensor_hint(value: Any) -> str | None:
    """What to do with a tensor numpy cannot read, or ``None`` for any other value."""
    device = getattr(getattr(value, "device", None), "type", "cpu")
    grad = getattr(value, "requires_grad", False) is True
    if not grad and device == "cpu":
        return None
    fix = "tensor" + (".detach()" if grad else "") + ("" if device == "cpu" else ".cpu()")
    why = "requires grad" if grad else f"is on {device}"
    return (
        f"is a tensor that {why}, which numpy cannot read: pass {fix} (replay stores "
        "values, not the autograd graph or device memory)"
    )


def as_column_array(value: Any, dtype: np.dtype, argument: str) -> np.ndarray:
    """``value`` as an array for a column of ``dtype`` (see :func:`as_array`).

    Raises:
        InvalidArgumentError: as :func:`as_array`.
        SignatureError: naming ``argument``, for anything numpy cannot read as one array.
    """
    try:
        arr = as_array(value, argument)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InvalidArgumentError):
            raise
        raise SignatureError(
            f"{argument}={describe(value)} cannot be read as one array ({exc}); give an array, "
            "or nested lists of one length per axis"
        ) from None
    if dtype.kind in "fc" and _python_ints(arr):
        try:
            with np.errstate(over="ignore"):
                converted = np.asarray(value, dtype=dtype)
        except OverflowError:
            return arr
        if np.isfinite(converted).all():
            return converted
    return arr  # refused by refusal(): an integer beyond the column's range


def refusal(argument: str, path: str, arr: np.ndarray, dtype: np.dtype, value: Any) -> str | None:
    """The message refusing ``value`` for column ``path`` of ``dtype``, or ``None``."""
    integers = _python_ints(arr)
    if integers:
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            bad = next(x for x in arr.flat if not info.min <= x <= info.max)
            reason = (
                f"holds {bad}, outside the range [{info.min}, {info.max}] of its column's {dtype}"
            )
        else:
            parts = np.dtype(dtype.char.lower()) if dtype.kind == "c" else dtype
            reason = (
                f"holds {describe(value)}, beyond the largest {parts} "
                f"({np.finfo(parts).max:g}): it would be stored as inf"
            )
    else:
        reason = cast_problem(arr, dtype)
        if reason is None:
            return None
    in_range_check = integers or (arr.dtype.kind in "iu" and dtype.kind in "iufc")
    shown = f" = {describe(value)}" if arr.ndim == 0 and not in_range_check else ""
    return (
        f"{argument}[{path!r}]{shown} {reason}; a value is stored only when it fits its "
        "column unchanged (see the rule in rlreplay.core.value_casting): convert or clip it first"
    )
