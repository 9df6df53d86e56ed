"""Checks of field specs, run once when a signature is built (never per insert).

They refuse what numpy would silently read as something else (a ``(dtype, shape)`` tuple,
``None`` as float64, ``"U"`` of length 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rlreplay.errors import InvalidArgumentError, describe

EXAMPLE = "((4,), 'float32')"
SEPARATOR = "/"  # between the names of a nested field's path


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def checked_shape(shape: Any) -> tuple[int, ...]:
    """``shape`` (an int or a sequence of ints >= 0) as a tuple of ints.

    Raises:
        InvalidArgumentError: for a string, a non-int or negative dimension, or anything else.
    """
    if _is_int(shape):
        shape = (shape,)
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
        raise InvalidArgumentError(
            f"shape={describe(shape)} is not a tuple of ints; give (shape, dtype), "
            f"e.g. {EXAMPLE}, and () for a scalar"
        )
    dims = tuple(shape)
    for d in dims:
        if not _is_int(d) or d < 0:
            raise InvalidArgumentError(
                f"shape={describe(shape)} has the dimension {describe(d)}; each dimension "
                "must be an int >= 0, e.g. (4,) or (84, 84)"
            )
    return tuple(int(d) for d in dims)


def checked_dtype(dtype: Any, shape: tuple[int, ...] = ()) -> np.dtype:
    """``dtype`` as one numpy dtype of fixed size, refusing what numpy would reinterpret.

    Raises:
        InvalidArgumentError: as :class:`FieldSpec`.
    """
    if dtype is None:
        raise InvalidArgumentError(
            "dtype=None is not a dtype (numpy would read it as float64); give e.g. 'float32'"
        )
    if isinstance(dtype, (tuple, list, dict)):
        raise InvalidArgumentError(
            f"dtype={describe(dtype)} is not one dtype (numpy would read it as a subarray or "
            f"structured dtype); give (shape, dtype), e.g. {EXAMPLE}"
        )
    if not isinstance(dtype, (np.dtype, str, type)):
        if hasattr(dtype, "observation_space") and hasattr(dtype, "action_space"):
            raise InvalidArgumentError(
                f"{describe(dtype)} is an environment, not a space; give its spaces, e.g. "
                "env.observation_space (for a vector env, env.single_observation_space)"
            )
        # numpy would read any object with a ``dtype`` attribute as that dtype alone
        raise InvalidArgumentError(
            f"dtype={describe(dtype)} ({type(dtype).__name__}) is not a numpy dtype; give a dtype "
            f"such as 'float32' or np.uint8, or the whole spec as (shape, dtype), e.g. {EXAMPLE}"
        )
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError) as exc:  # numpy parses strings such as 'f4,('
        raise InvalidArgumentError(
            f"dtype={describe(dtype)} is not a numpy dtype; give e.g. 'float32'"
        ) from exc
    if dt.subdtype is not None:
        base, sub = dt.subdtype
        raise InvalidArgumentError(
            f"dtype={describe(dtype)} is a numpy subarray dtype ({base} of shape {sub}); give "
            f"the shape apart: (shape, dtype), e.g. ({(*shape, *sub)!r}, {base.name!r})"
        )
    if dt.names is not None:
        raise InvalidArgumentError(
            f"dtype={describe(dtype)} is a structured dtype with fields {list(dt.names)}; "
            "give each as its own signature field (nest dicts to group them)"
        )
    if dt.hasobject:
        raise InvalidArgumentError(f"dtype={dt} holds Python objects; store numeric arrays instead")
    if dt.itemsize == 0:
        raise InvalidArgumentError(
            f"dtype={describe(dtype)} has no length, so every value would be cut to fit; "
            "give one, e.g. 'U16' (16 characters) or 'S16' (16 bytes)"
        )
    if dt.kind in "mM" and np.datetime_data(dt)[0] == "generic":
        raise InvalidArgumentError(
            f"dtype={describe(dtype)} has no unit; give one, e.g. '{dt.name}[ms]'"
        )
    return dt


def is_dtype(value: Any) -> bool:
    """Whether ``value`` names a dtype (so it cannot be a shape)."""
    if isinstance(value, (np.dtype, type)):
        return True
    try:
        return isinstance(value, str) and np.dtype(value) is not None
    except (TypeError, ValueError, SyntaxError):
        return False


def swapped_example(leaf: tuple) -> str:
    """``leaf``, a ``(dtype, shape)`` tuple, written the right way round when it can be."""
    try:
        shape, dtype = checked_shape(leaf[1]), checked_dtype(leaf[0])
    except InvalidArgumentError:
        return EXAMPLE
    name = leaf[0] if isinstance(leaf[0], str) else dtype.name
    return f"({shape!r}, {name!r})"


def empty_branch(tree: Mapping[str, Any], prefix: str = "") -> str | None:
    """The path of the first empty nested dict in ``tree``, or ``None``."""
    for key, value in tree.items():
        if isinstance(value, Mapping):
            path = f"{prefix}{key}"
            found = path if not value else empty_branch(value, path + SEPARATOR)
            if found is not None:
                return found
    return None
