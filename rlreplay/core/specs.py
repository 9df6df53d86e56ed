"""Signatures: the named fields of a step, each with a fixed shape and dtype.

A signature is given as a (possibly nested) dict whose leaves are :class:`FieldSpec`,
``(shape, dtype)`` tuples or ``numpy.dtype``-likes (a scalar). Nested dicts are flattened
to paths such as ``"obs/image"``; every other part of the library speaks in paths.

Values and column dtypes (one rule, the same for Python scalars, numpy scalars and
arrays, one row or a batch, with or without the compiled writes): a value is stored when it
converts to its column's dtype without changing in kind or in value, and refused with a
:class:`SignatureError` naming the field, the value and the dtype otherwise. Nothing is
ever wrapped or truncated.

- a bool goes into any numeric column (as 0 or 1);
- an integer goes into an integer column whose range holds it (``300`` into ``uint8``,
  ``-1`` into ``uint32`` or ``2**40`` into ``int32`` are refused), and into a float or
  complex column (rounded to the nearest representable value, as ``2**60`` into float32);
- a float goes into a float or complex column, rounded to the column's precision
  (float64 into float32: to the nearest float32, magnitudes beyond its range to ±inf); a
  float into an integer or bool column is refused, whatever its value (``1.0`` as well);
- a complex value goes only into a complex column;
- any other kind (datetime, timedelta, bytes, str) only when numpy casts it safely
  (``datetime64[s]`` into ``datetime64[ms]``, not back; no truncated strings).

Example:
    >>> sig = Signature({"obs": {"image": ((84, 84), "uint8")}, "reward": "float32"})
    >>> sig.paths
    ('obs/image', 'reward')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.core.spec_checks import (
    EXAMPLE,
    SEPARATOR,
    checked_dtype,
    checked_shape,
    empty_branch,
    is_dtype,
    swapped_example,
)
from rlreplay.errors import InvalidArgumentError, SignatureError, describe


@dataclass(frozen=True)
class FieldSpec:
    """Shape (without the leading step axis) and dtype of one stored field.

    Args:
        shape: an int or a tuple of ints >= 0 (``()`` for a scalar).
        dtype: one numpy dtype of fixed size, e.g. ``"float32"``, ``np.uint8``, ``"U16"``.

    Raises:
        InvalidArgumentError: for a shape that is not ints >= 0, or a dtype numpy would
            reinterpret (``None`` as float64, a tuple or list as a subarray or structured
            dtype), a structured or subarray dtype, one holding Python objects, a string or
            bytes dtype without a length, or a datetime without a unit.
    """

    shape: tuple[int, ...]
    dtype: np.dtype

    def __init__(self, shape: int | tuple[int, ...] = (), dtype: Any = np.float32):
        shape = checked_shape(shape)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", checked_dtype(dtype, shape))

    @property
    def nbytes(self) -> int:
        """Bytes one step of this field occupies."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype.str}

    @classmethod
    def from_json(cls, data: Mapping) -> FieldSpec:
        return cls(tuple(data["shape"]), np.dtype(data["dtype"]))


def cast_problem(arr: np.ndarray, dtype: np.dtype) -> str | None:
    """Why ``arr`` may not be stored as ``dtype`` under the module's casting rule, or
    ``None`` when it may (then ``col[...] = arr`` stores every value unchanged in kind and,
    for integers, exactly). Integer arrays cast to a narrower integer type are scanned for
    their range (one pass), other checks look at the dtypes only."""
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
    elif kind == "f":
        allowed = into in "fc"
    elif kind == "c":
        allowed = into == "c"
    elif kind == "O":
        allowed = False
    else:
        allowed = np.can_cast(src, dtype, casting="safe")
    if allowed:
        return None
    return f"has dtype {src}, which cannot be stored as {dtype} without changing its kind"


def _python_ints(arr: np.ndarray) -> bool:
    """Whether an object array holds only Python ints (some too large for int64)."""
    return arr.dtype == object and all(type(x) is int for x in arr.flat)


def _as_array(value: Any, dtype: np.dtype) -> np.ndarray:
    """``value`` as an array for a column of ``dtype``. Python ints too large for 64 bits
    give an object array; for a float or complex column, which the rule lets them into,
    they are converted instead (rounded)."""
    arr = np.asarray(value)
    if dtype.kind in "fc" and _python_ints(arr):
        try:
            return np.asarray(value, dtype=dtype)
        except OverflowError:
            pass
    return arr


def _refusal(argument: str, path: str, arr: np.ndarray, dtype: np.dtype, value: Any) -> str | None:
    """The message refusing ``value`` (as ``arr``) for the column ``path`` of ``dtype``, or
    ``None`` when :func:`cast_problem` admits it."""
    integers = _python_ints(arr)
    if integers:
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            bad = next(x for x in arr.flat if not info.min <= x <= info.max)
            reason = (
                f"holds {bad}, outside the range [{info.min}, {info.max}] of its column's {dtype}"
            )
        else:
            reason = f"holds {describe(value)}, which its column's {dtype} cannot hold"
    else:
        reason = cast_problem(arr, dtype)
        if reason is None:
            return None
    in_range_check = integers or (arr.dtype.kind in "iu" and dtype.kind in "iu")
    shown = f" = {describe(value)}" if arr.ndim == 0 and not in_range_check else ""
    return (
        f"{argument}[{path!r}]{shown} {reason}; a value is stored only when it fits its "
        "column unchanged (see the rule in rlreplay.core.specs): convert or clip it first"
    )


def _as_spec(path: str, leaf: Any) -> FieldSpec:
    """The :class:`FieldSpec` a signature's ``leaf`` at ``path`` describes.

    Raises:
        InvalidArgumentError: naming ``path``, for a ``(dtype, shape)`` tuple (swapped),
            a list or a tuple of another length, or what :class:`FieldSpec` refuses.
    """
    if isinstance(leaf, FieldSpec):
        return leaf
    try:
        if isinstance(leaf, tuple) and len(leaf) == 2:
            if is_dtype(leaf[0]):
                raise InvalidArgumentError(
                    f"{describe(leaf)} gives the dtype first; give (shape, dtype), "
                    f"e.g. {swapped_example(leaf)}"
                )
            return FieldSpec(leaf[0], leaf[1])
        if isinstance(leaf, np.ndarray):
            return FieldSpec(leaf.shape, leaf.dtype)
        if isinstance(leaf, (tuple, list)):
            raise InvalidArgumentError(
                f"{describe(leaf)} is not a spec; give a FieldSpec, a (shape, dtype) tuple, "
                f"e.g. {EXAMPLE}, or a dtype"
            )
        return FieldSpec((), leaf)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"signature field {path!r}: {exc}") from None


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to ``{"a/b": leaf}``; keys must be non-empty strings."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if not isinstance(key, str) or not key or SEPARATOR in key:
            raise InvalidArgumentError(
                f"field name {describe(key)} must be a non-empty string without "
                f"{SEPARATOR!r}; nest dicts instead"
            )
        path = prefix + key
        if isinstance(value, Mapping):
            out.update(flatten(value, path + SEPARATOR))
        else:
            out[path] = value
    return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten`."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(SEPARATOR)
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


class Signature:
    """Ordered mapping of field path to :class:`FieldSpec`.

    Args:
        fields: a (possibly nested) dict whose leaves are :class:`FieldSpec`,
            ``(shape, dtype)`` tuples or dtypes (scalars), or a :class:`Signature`.

    Raises:
        InvalidArgumentError: naming the field, for an empty signature or nested dict, a
            field name that is not a non-empty string, a ``(dtype, shape)`` tuple (say
            ``(shape, dtype)``), or a spec :class:`FieldSpec` refuses.
    """

    def __init__(self, fields: Mapping[str, Any] | Signature):
        if isinstance(fields, Signature):
            self.fields: dict[str, FieldSpec] = dict(fields.fields)
        elif not isinstance(fields, Mapping) or not fields:
            raise InvalidArgumentError(
                f"signature={describe(fields)} must be a non-empty dict of field specs, "
                f"e.g. {{'obs': {EXAMPLE}, 'reward': 'float32'}}"
            )
        elif (empty := empty_branch(fields)) is not None:
            raise InvalidArgumentError(
                f"signature field {empty!r} is an empty dict; give it fields or leave it out"
            )
        else:
            self.fields = {p: _as_spec(p, leaf) for p, leaf in flatten(fields).items()}
        # Per-field (path, shape, ndim, dtype), read by the validation fast paths.
        self._checks = tuple(
            (p, spec.shape, len(spec.shape), spec.dtype) for p, spec in self.fields.items()
        )
        self._paths = self.fields.keys()

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self.fields)

    @property
    def step_nbytes(self) -> int:
        return sum(spec.nbytes for spec in self.fields.values())

    def __getitem__(self, path: str) -> FieldSpec:
        try:
            return self.fields[path]
        except KeyError:
            raise SignatureError(
                f"unknown field {path!r}; the signature has {list(self.fields)}"
            ) from None

    def __contains__(self, path: object) -> bool:
        return path in self.fields

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Signature) and self.fields == other.fields

    def __repr__(self) -> str:
        inner = ", ".join(f"{p}: {spec.dtype}{list(spec.shape)}" for p, spec in self.fields.items())
        return f"Signature({inner})"

    def to_json(self) -> dict:
        return {p: spec.to_json() for p, spec in self.fields.items()}

    @classmethod
    def from_json(cls, data: Mapping) -> Signature:
        """The signature :meth:`to_json` wrote (its paths are nested again).

        Raises:
            InvalidArgumentError: for a malformed field spec.
        """
        return cls(unflatten({p: FieldSpec.from_json(v) for p, v in data.items()}))

    def check_batch(self, data: Mapping[str, Any], argument: str = "data") -> tuple[dict, int]:
        """Validate a batch of steps (every field has a leading batch axis).

        Args:
            data: nested or flat dict with one array per field, each ``[n, *shape]``.
            argument: the argument's name, for error messages.

        Returns:
            ``(flat dict of numpy arrays, n)``.

        Raises:
            SignatureError: on missing or unknown fields, wrong shapes, values their
                column's dtype cannot hold (see the module's casting rule), or fields whose
                batch sizes differ.
        """
        flat = self._flat_fields(data, argument)
        out: dict[str, np.ndarray] = {}
        n = -1
        for path, shape, ndim, dtype in self._checks:
            value = arr = flat[path]
            if type(arr) is not np.ndarray:
                arr = _as_array(self._leaf(arr, data, argument), dtype)
            if arr.ndim != ndim + 1 or arr.shape[1:] != shape:
                raise SignatureError(
                    f"{argument}[{path!r}] has shape {arr.shape}; expected "
                    f"(batch, {', '.join(map(str, shape))}) with "
                    f"trailing shape {shape}"
                )
            if arr.dtype != dtype:
                refused = _refusal(argument, path, arr, dtype, value)
                if refused is not None:
                    raise SignatureError(refused)
            if n == -1:
                n = arr.shape[0]
            elif arr.shape[0] != n:
                raise SignatureError(
                    f"{argument} fields have different batch sizes: {path!r} has "
                    f"{arr.shape[0]}, an earlier field has {n}"
                )
            out[path] = arr
        return out, n

    def check_step(self, data: Mapping[str, Any], argument: str = "step") -> dict:
        """Validate one step (no batch axis). Returns a flat dict of numpy arrays.

        Raises:
            SignatureError: as :meth:`check_batch`.
        """
        return self.check_row(data, argument, keep_floats=False)

    def check_row(self, data: Mapping[str, Any], argument: str, keep_floats: bool = True) -> dict:
        """Validate one step like :meth:`check_step`, for storing it into one row.

        With ``keep_floats``, a Python ``float`` given for a scalar float field is returned
        as is (assigning it to a row needs no array), which saves an array per field.

        Raises:
            SignatureError: as :meth:`check_batch`.
        """
        flat = self._flat_fields(data, argument)
        out = {}
        for path, shape, _, dtype in self._checks:
            value = flat[path]
            if type(value) is np.ndarray:
                arr = value
            elif keep_floats and type(value) is float and not shape and dtype.kind in "fc":
                out[path] = value
                continue
            else:
                arr = _as_array(self._leaf(value, data, argument), dtype)
            if arr.shape != shape:
                raise SignatureError(
                    f"{argument}[{path!r}] has shape {arr.shape}; expected {shape}"
                )
            if arr.dtype != dtype:
                refused = _refusal(argument, path, arr, dtype, value)
                if refused is not None:
                    raise SignatureError(refused)
            out[path] = arr
        return out

    def _flat_fields(self, data: Any, argument: str) -> Mapping[str, Any]:
        """``data`` flattened to paths, with exactly the signature's fields.

        A flat dict whose keys are already the paths (the common case, and what
        :meth:`check_batch` returns, e.g. the rows a client sends a server for a nested
        signature) is returned as is.

        Raises:
            SignatureError: if ``data`` is not a dict or its fields differ from the signature.
        """
        if type(data) is dict and data.keys() == self._paths:
            return data  # values that are dicts are caught by _leaf
        return self._flatten(data, argument)

    def _leaf(self, value: Any, data: Any, argument: str) -> Any:
        """``value`` if it is not a dict; for a dict, raise the error the slow path gives."""
        if isinstance(value, Mapping):
            self._flatten(data, argument)
        return value

    def _flatten(self, data: Any, argument: str) -> Mapping[str, Any]:
        flat = flatten(data) if isinstance(data, Mapping) else None
        if flat is None:
            raise SignatureError(f"{argument} must be a dict of arrays, got {describe(data)}")
        if flat.keys() != self.fields.keys():
            missing = [p for p in self.fields if p not in flat]
            extra = [p for p in flat if p not in self.fields]
            raise SignatureError(
                f"{argument} fields do not match the signature: missing {missing}, "
                f"unknown {extra}; expected exactly {list(self.fields)}"
            )
        return flat
