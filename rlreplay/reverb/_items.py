"""How a Reverb item (a flat list of columns) is kept in a row of an rlreplay table.

* A table with a signature of fixed shapes keeps its items *typed*: one rlreplay column
  per flat signature leaf (``c0``, ``c1``, ...) with the leaf's shape and dtype, and a
  ``steps`` column: 1 for an item written as one timestep (``Client.insert``, the legacy
  ``Writer``), whose columns are ``[1, *shape]`` and come back so, 0 for an item whose
  columns have the signature's shapes themselves (a ``TrajectoryWriter`` item).
* A table without a signature (or with a dimension of any size) keeps each item
  *serialized*: its columns' dtypes and shapes, then their bytes, in one ``uint8`` row of
  ``max_item_bytes``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from rlreplay.reverb.errors import InvalidArgumentError, SignatureError
from rlreplay.reverb.specs import TensorSpec, shape_text, tf_dtype_name

DEFAULT_MAX_ITEM_BYTES = 16 << 10
_HEADER = struct.Struct("<I")


class ItemFormat:
    """The storage of one table's items (see the module docstring).

    Args:
        specs: the flat signature (typed storage), or ``None`` (serialized items).
        max_item_bytes: serialized storage only: the most bytes one item may take.
    """

    def __init__(
        self, specs: list[TensorSpec] | None, max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES
    ):
        typed = specs is not None and all(None not in s.shape for s in specs)
        typed = typed and all(s.dtype != object for s in specs)  # type: ignore[union-attr]
        self.specs = specs
        self.typed = typed
        # (shape, dtype) per column where the signature has no dimension of any size
        self._exact = None if not typed else [(tuple(x.shape), x.dtype) for x in specs]
        self.max_item_bytes = int(max_item_bytes)
        if typed:
            self.fields = [f"c{i}" for i in range(len(specs))]  # type: ignore[arg-type]
            self.shapes = [tuple(s.shape) for s in specs]  # type: ignore[union-attr]
            self.dtypes = [s.dtype for s in specs]  # type: ignore[union-attr]

    # ---------------------------------------------------------------- description
    def rlreplay_signature(self) -> dict[str, Any]:
        if self.typed:
            sig: dict[str, Any] = {
                f: (shape, dt) for f, shape, dt in zip(self.fields, self.shapes, self.dtypes)
            }
            sig["steps"] = "uint8"
            return sig
        return {"blob": ((self.max_item_bytes,), "uint8")}

    def to_json(self) -> dict[str, Any]:
        specs = (
            None
            if self.specs is None
            else [{"shape": list(s.shape), "dtype": s.dtype.str} for s in self.specs]
        )
        return {"specs": specs, "max_item_bytes": self.max_item_bytes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ItemFormat:
        specs = data["specs"]
        if specs is not None:
            specs = [TensorSpec(tuple(s["shape"]), np.dtype(s["dtype"])) for s in specs]
        return cls(specs, data["max_item_bytes"])

    # ------------------------------------------------------------------ encoding
    def check(self, table: str, columns: list[np.ndarray], timestep: bool) -> int:
        """The ``steps`` value of an item of ``columns`` (see the module docstring), once
        the item is known to fit the table: whatever passes goes into a row.

        Raises:
            SignatureError: naming the table and the column, if the item does not match
                the table's signature.
            InvalidArgumentError: for a serialized item larger than ``max_item_bytes`` or
                holding Python objects.
        """
        steps = self._steps(table, columns, timestep)
        if not self.typed:
            self._header(table, columns)
        return steps

    def _steps(self, table: str, columns: list[np.ndarray], timestep: bool) -> int:
        """:meth:`check` against the signature alone."""
        specs = self.specs
        if specs is None:
            return 0
        exact = self._exact
        if exact is not None and len(columns) == len(exact):
            for col, (shape, dtype) in zip(columns, exact):
                if col.shape != shape or (col.dtype is not dtype and col.dtype != dtype):
                    break
            else:
                return 0  # the common case: every column has the signature's shape
        if len(columns) != len(specs):
            raise SignatureError(
                f"item for table {table!r} has {len(columns)} columns but the table's "
                f"signature has {len(specs)}; give one column per signature leaf"
            )
        steps = 0
        for i, (col, spec) in enumerate(zip(columns, specs)):
            if col.dtype != spec.dtype:
                raise SignatureError(
                    f"item for table {table!r}: column {i} has dtype "
                    f"{tf_dtype_name(col.dtype)} but the signature says "
                    f"{tf_dtype_name(spec.dtype)}; cast it (np.asarray(x, dtype))"
                )
            if _fits(col.shape, spec.shape):
                continue
            if timestep and col.shape[:1] == (1,) and _fits(col.shape[1:], spec.shape):
                steps = 1
                continue
            raise SignatureError(
                f"item for table {table!r}: column {i} has shape {shape_text(col.shape)}, "
                f"which is incompatible with the signature's {shape_text(spec.shape)}"
                + (" (one timestep of it)" if timestep else "")
            )
        if steps and not all(c.shape[:1] == (1,) for c in columns):
            raise SignatureError(
                f"item for table {table!r}: some columns are one timestep of the signature "
                "and others the whole of it; write the item one way"
            )
        return steps

    def encode(self, table: str, columns: list[np.ndarray], timestep: bool) -> dict[str, Any]:
        """The rlreplay row of an item.

        Raises:
            SignatureError: see :meth:`check`.
            InvalidArgumentError: for a serialized item larger than ``max_item_bytes`` or
                holding Python objects.
        """
        steps = self._steps(table, columns, timestep)
        if self.typed:
            row: dict[str, Any] = {f: (c[0] if steps else c) for f, c in zip(self.fields, columns)}
            row["steps"] = steps
            return row
        return {"blob": self.serialize(table, columns)}

    def _header(self, table: str, columns: list[np.ndarray]) -> bytes:
        """A serialized item's header (its columns' dtypes and shapes).

        Raises:
            InvalidArgumentError: see :meth:`check`.
        """
        for c in columns:
            if c.dtype == object:
                raise InvalidArgumentError(
                    f"item for table {table!r} holds Python objects (dtype object); give "
                    "numeric, bool or fixed-size string arrays"
                )
        header = json.dumps([[c.dtype.str, list(c.shape)] for c in columns]).encode()
        size = _HEADER.size + len(header) + sum(c.nbytes for c in columns)
        if size > self.max_item_bytes:
            raise InvalidArgumentError(
                f"item for table {table!r} takes {size} bytes, more than the table's "
                f"max_item_bytes={self.max_item_bytes}; give the table a signature (typed "
                "storage has no such limit) or a larger max_item_bytes"
            )
        return header

    def serialize(self, table: str, columns: list[np.ndarray]) -> np.ndarray:
        header = self._header(table, columns)
        blob = np.zeros(self.max_item_bytes, np.uint8)
        _HEADER.pack_into(blob, 0, len(header))
        pos = _HEADER.size
        blob[pos : pos + len(header)] = np.frombuffer(header, np.uint8)
        pos += len(header)
        for c in columns:
            n = c.nbytes
            blob[pos : pos + n] = np.frombuffer(np.ascontiguousarray(c).tobytes(), np.uint8)
            pos += n
        return blob

    # ------------------------------------------------------------------ decoding
    def decode(self, data: dict[str, np.ndarray]) -> list[list[np.ndarray]]:
        """Each sampled item's flat columns, from a sampled batch's ``data``."""
        if self.typed:
            cols = [data[f] for f in self.fields]
            steps = data["steps"]
            out = []
            for i in range(len(steps)):
                if steps[i]:
                    out.append([c[i : i + 1].copy() for c in cols])
                else:
                    out.append([c[i].copy() for c in cols])
            return out
        return [deserialize(row) for row in data["blob"]]


def deserialize(blob: np.ndarray) -> list[np.ndarray]:
    raw = blob.tobytes()
    (n,) = _HEADER.unpack_from(raw, 0)
    pos = _HEADER.size + n
    out = []
    for dtype, shape in json.loads(raw[_HEADER.size : pos]):
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        out.append(np.frombuffer(raw, dt, count, pos).reshape(shape).copy())
        pos += count * dt.itemsize
    return out


def _fits(shape: tuple[int, ...], spec: tuple[int | None, ...]) -> bool:
    return len(shape) == len(spec) and all(s is None or d == s for d, s in zip(shape, spec))
