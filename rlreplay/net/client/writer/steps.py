"""The steps a remote writer has buffered since its last chunk.

Each step is copied in when appended (callers may reuse their arrays), into the rows of the
next chunk's arrays: by the store's compiled row write when the values fit as they are (the
same rule as a local store's write, so a step is stored identically either way), else
checked and converted first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core._compiled import load_kernel
from rlreplay.core.specs import Signature
from rlreplay.errors import InvalidArgumentError

_kernel = load_kernel("rlreplay.core._store")


class StepBuffer:
    """Steps buffered for the next chunk of one remote writer, at most ``capacity``.

    Args:
        signature: the steps' signature (of the writer's tables).
        capacity: steps a chunk holds.

    Attributes:
        n: steps buffered.
    """

    def __init__(self, signature: Signature, capacity: int):
        self.signature = signature
        self.capacity = capacity
        self._fields = [(p, s.shape, s.dtype) for p, s in signature.fields.items()]
        self._paths = tuple(signature.paths)
        # Whether steps that fit go through the compiled row write; False: always checked.
        self.compiled_writes = _kernel is not None
        self._columns = self._new_columns()
        self.n = 0

    def _new_columns(self) -> tuple[np.ndarray, ...]:
        return tuple(np.empty((self.capacity, *s), dtype=d) for _, s, d in self._fields)

    def add(self, step: Mapping[str, Any]) -> None:
        """Copy one step in.

        Raises:
            SignatureError: if the step does not match the signature (nothing is taken).
        """
        if not (
            self.compiled_writes
            and _kernel.put_row(np.ndarray, self._columns, self._paths, self.n, step)
        ):
            flat = self.signature.check_step(step, "step")
            for col, (path, _, _) in zip(self._columns, self._fields):
                col[self.n] = flat[path]
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
        n = self.n
        for col, (path, _, _) in zip(self._columns, self._fields):
            col[n : n + count] = arrays[path][start : start + count]
        self.n = n + count

    def take(self, items: list) -> dict[str, np.ndarray]:
        """The arrays of a chunk of the buffered steps and ``items``; the buffer is then empty
        (when this raises, nothing changed).

        A full buffer hands over its arrays (new ones are made first); a partial one hands
        over copies of its rows, so a chunk never holds more memory than its steps.
        """
        arrays = {}
        if items:
            table = np.array(items, dtype=np.float64)
            arrays["item_table"] = table[:, 0].astype(np.int32)
            arrays["item_anchor"] = table[:, 1].astype(np.int64)
            arrays["item_priority"] = table[:, 2]
            if (table[:, 3] >= 0).any():  # only layouts with per-item extents use lengths
                arrays["item_length"] = table[:, 3].astype(np.int64)
        n = self.n
        if n == self.capacity:
            steps, self._columns = self._columns, self._new_columns()
        else:
            steps = tuple(col[:n].copy() for col in self._columns)
        for col, (path, _, _) in zip(steps, self._fields):
            arrays["data/" + path] = col
        self.n = 0
        return arrays
