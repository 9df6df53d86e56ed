"""The steps a remote writer has buffered since its last chunk.

Each step is copied in when appended (callers may reuse their arrays); values of exactly
the stored shape and dtype take a fast path, others are checked and converted first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.specs import Signature
from rlreplay.errors import InvalidArgumentError
from rlreplay.net.client.writer.chunks import chunk_arrays


class StepBuffer:
    """Steps buffered for the next chunk of one remote writer.

    Args:
        signature: the steps' signature (of the writer's tables).

    Attributes:
        n: steps buffered.
    """

    def __init__(self, signature: Signature):
        self.signature = signature
        self._fields = [(p, s.shape, s.dtype) for p, s in signature.fields.items()]
        self._paths = set(signature.paths)
        self.clear()

    def clear(self) -> None:
        """Forget the buffered steps (they were sealed into a chunk)."""
        self._parts: list[list] = [[] for _ in self._fields]
        self.n = 0

    def add(self, step: Mapping[str, Any]) -> None:
        """Copy one step in.

        Raises:
            SignatureError: if the step does not match the signature (nothing is taken).
        """
        if step.keys() != self._paths:
            return self._add_checked(step)
        values = []
        for path, shape, dtype in self._fields:
            value = step[path]
            # Fast path: arrays and numpy scalars of exactly the stored shape and dtype.
            vtype = getattr(value, "dtype", None)
            if (vtype is not dtype and vtype != dtype) or value.shape != shape:
                return self._add_checked(step)
            values.append(value)
        for parts, value, (_, shape, _) in zip(self._parts, values, self._fields):
            if shape:
                parts.append(value.tobytes())
            else:  # numpy scalars are immutable; 0-d arrays are not
                parts.append(value[()] if value.__class__ is np.ndarray else value)
        self.n += 1
        return None

    def _add_checked(self, step: Mapping[str, Any]) -> None:
        flat = self.signature.check_step(step, "step")
        for parts, (path, shape, dtype) in zip(self._parts, self._fields):
            value = np.asarray(flat[path], dtype=dtype)
            parts.append(value.tobytes() if shape else value[()])
        self.n += 1

    def check_batch(self, steps: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
        """``steps`` (each field ``[n, ...]``) as arrays of the stored dtypes, and ``n``.

        Raises:
            SignatureError, InvalidArgumentError: for steps that do not match the
                signature, or no step.
        """
        arrays, n = self.signature.check_batch(steps, "steps")
        if n < 1:
            raise InvalidArgumentError(f"steps hold {n} steps; append at least one")
        fields = self._fields
        return {p: np.asarray(a, dtype=d) for (p, _, d), a in zip(fields, arrays.values())}, n

    def add_rows(self, arrays: Mapping[str, np.ndarray], start: int, count: int) -> None:
        """Copy rows ``[start, start + count)`` of arrays from :meth:`check_batch` in."""
        for parts, (path, shape, _) in zip(self._parts, self._fields):
            part = arrays[path][start : start + count]
            if shape:
                parts.append(part.tobytes())
            else:
                parts.extend(part)
        self.n += count

    def chunk_arrays(self, items: list) -> dict[str, np.ndarray]:
        """The arrays of a chunk of the buffered steps and ``items``."""
        return chunk_arrays(self._parts, self._fields, self.n, items)
