"""Tensor specs without TensorFlow: :class:`TensorSpec`, dtype names, spec nests.

Any object with ``shape`` and ``dtype`` serves as a spec (TensorFlow's ``tf.TensorSpec``
when it is installed, ``jax.ShapeDtypeStruct``, :class:`TensorSpec`); its ``dtype`` is a
numpy dtype or has ``as_numpy_dtype`` as TensorFlow's dtypes do. TensorFlow is never
imported here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.errors import describe
from rlreplay.reverb import _nest
from rlreplay.reverb.errors import InvalidArgumentError, SignatureError

# TensorFlow's names of numpy dtypes, as Reverb's error messages spell them.
_TF_NAMES = {
    "float16": "half",
    "float32": "float",
    "float64": "double",
    "bool": "bool",
    "complex64": "complex64",
    "complex128": "complex128",
    "object": "string",
}


def tf_dtype_name(dtype: np.dtype) -> str:
    """TensorFlow's name of a numpy dtype (``float64`` is ``double``)."""
    return _TF_NAMES.get(dtype.name, dtype.name)


def shape_text(shape: tuple[int | None, ...]) -> str:
    """A shape as Reverb's messages write it: ``[1,2]``."""
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def as_numpy_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype of ``dtype`` (a numpy dtype-like or a TensorFlow-style dtype).

    Raises:
        InvalidArgumentError: naming ``dtype`` when it is neither.
    """
    inner = getattr(dtype, "as_numpy_dtype", None)
    if inner is not None:
        dtype = inner() if callable(inner) and not isinstance(inner, type) else inner
    try:
        return np.dtype(dtype)
    except TypeError:
        raise InvalidArgumentError(
            f"dtype={describe(dtype)} is not a numpy dtype and has no as_numpy_dtype; give a "
            "numpy dtype such as np.float32"
        ) from None


def _shape_tuple(shape: Any) -> tuple[int | None, ...]:
    if shape is None:
        raise InvalidArgumentError("shape=None (unknown rank) is not supported; give a shape")
    as_list = getattr(shape, "as_list", None)
    dims = as_list() if callable(as_list) else shape
    out = []
    for d in dims:
        d = getattr(d, "value", d)  # TensorFlow 1's Dimension
        out.append(None if d is None else int(d))
    return tuple(out)


class TensorSpec:
    """Shape and dtype of a tensor (Reverb's ``tf.TensorSpec``, with numpy dtypes).

    Args:
        shape: sequence of ints (``None`` for a dimension of any size).
        dtype: numpy dtype-like, or a dtype with ``as_numpy_dtype``.
        name: optional name.

    Two specs are equal when their shapes, dtypes and names are; a ``TensorSpec`` also
    equals any other object with the same ``shape``, ``dtype`` (and ``name``, where it has
    one), such as TensorFlow's.

    Raises:
        InvalidArgumentError: for a dtype that is not one, or a shape that is not ints.
    """

    __slots__ = ("dtype", "name", "shape")

    def __init__(self, shape: Any, dtype: Any = np.float32, name: str | None = None):
        try:
            self.shape = _shape_tuple(shape)
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"shape={describe(shape)} must be a sequence of ints (None for any size)"
            ) from None
        self.dtype = as_numpy_dtype(dtype)
        self.name = name

    @classmethod
    def from_spec(cls, spec: Any, name: str | None = None) -> TensorSpec:
        """A :class:`TensorSpec` with ``spec``'s shape, dtype and name."""
        return cls(
            spec.shape, spec.dtype, name if name is not None else getattr(spec, "name", None)
        )

    @classmethod
    def from_array(cls, array: Any, name: str | None = None) -> TensorSpec:
        array = np.asarray(array)
        return cls(array.shape, array.dtype, name)

    def is_compatible_with(self, other: Any) -> bool:
        """Whether ``other`` (a spec or an array) has this dtype and a shape that fits."""
        try:
            shape, dtype = _shape_tuple(other.shape), as_numpy_dtype(other.dtype)
        except (AttributeError, InvalidArgumentError, TypeError):
            return False
        return dtype == self.dtype and shape_fits(shape, self.shape)

    def __eq__(self, other: object) -> bool:
        if not (hasattr(other, "shape") and hasattr(other, "dtype")):
            return NotImplemented
        try:
            shape = _shape_tuple(other.shape)  # type: ignore[attr-defined]
            dtype = as_numpy_dtype(other.dtype)  # type: ignore[attr-defined]
        except (InvalidArgumentError, TypeError, ValueError):
            return False
        return (shape, dtype, getattr(other, "name", self.name)) == (
            self.shape,
            self.dtype,
            self.name,
        )

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype, self.name))

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype.name}, name={self.name!r})"

    def __reduce__(self) -> tuple:
        return TensorSpec, (self.shape, self.dtype.str, self.name)


def shape_fits(shape: tuple[int | None, ...], spec_shape: tuple[int | None, ...]) -> bool:
    """Whether ``shape`` fits ``spec_shape`` (``None`` dimensions take any size)."""
    return len(shape) == len(spec_shape) and all(
        s is None or d is None or d == s for d, s in zip(shape, spec_shape)
    )


def is_spec(x: object) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.ndarray)


def check_signature(signature: Any) -> list[TensorSpec]:
    """The flat specs of a signature nest, as :class:`TensorSpec`.

    Raises:
        SignatureError: naming the path of a leaf that is not a spec (an object with
            ``shape`` and ``dtype``), or an empty nest.
    """
    flat = _nest.flatten_with_path(signature)
    out = []
    for path, leaf in flat:
        if not is_spec(leaf):
            raise SignatureError(
                f"Unsupported signature spec at {path}: {describe(leaf)}; every leaf of a "
                "signature must have shape and dtype (rlreplay.reverb.TensorSpec, "
                "tf.TensorSpec, jax.ShapeDtypeStruct)"
            )
        try:
            out.append(TensorSpec.from_spec(leaf))
        except InvalidArgumentError as exc:
            raise SignatureError(f"signature leaf at {path}: {exc}") from None
    if not out:
        raise SignatureError(f"signature={describe(signature)} has no specs; give at least one")
    return out


# --------------------------------------------------------------- JSON of spec nests
def nest_to_json(nest: Any) -> Any:
    """A spec nest as JSON-able data (dicts, lists, tuples, namedtuples, TensorSpec)."""
    if isinstance(nest, dict):
        return {"t": "dict", "items": [[k, nest_to_json(v)] for k, v in nest.items()]}
    if _nest.is_namedtuple(nest):
        cls = type(nest)
        return {
            "t": "namedtuple",
            "module": cls.__module__,
            "name": cls.__qualname__,
            "fields": list(cls._fields),
            "items": [nest_to_json(v) for v in nest],
        }
    if isinstance(nest, (list, tuple)):
        return {
            "t": type(nest).__name__ if type(nest) in (list, tuple) else "list",
            "items": [nest_to_json(v) for v in nest],
        }
    spec = TensorSpec.from_spec(nest)
    return {"t": "spec", "shape": list(spec.shape), "dtype": spec.dtype.str, "name": spec.name}


def _namedtuple_class(module: str, name: str, fields: list[str]) -> type:
    import collections
    import importlib

    try:
        cls: Any = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
        if isinstance(cls, type) and list(getattr(cls, "_fields", ())) == fields:
            return cls
    except (ImportError, AttributeError):
        pass
    return collections.namedtuple(name.split(".")[-1], fields)


def nest_from_json(data: Any) -> Any:
    """Inverse of :func:`nest_to_json` (a namedtuple class that cannot be imported here
    comes back as a namedtuple of the same name and fields)."""
    kind = data["t"]
    if kind == "spec":
        return TensorSpec(tuple(data["shape"]), np.dtype(data["dtype"]), data["name"])
    if kind == "dict":
        return {k: nest_from_json(v) for k, v in data["items"]}
    items = [nest_from_json(v) for v in data["items"]]
    if kind == "namedtuple":
        return _namedtuple_class(data["module"], data["name"], data["fields"])(*items)
    return tuple(items) if kind == "tuple" else items
