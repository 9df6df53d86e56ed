"""Output arrays for sampled batches, reused once nothing outside refers to them.

A batch of large items is megabytes (256 Atari frames stacks are 7 MB a field). A fresh
array for every batch is fresh memory from the operating system, and its first write pays a
page fault per 4 KiB page: on the machines measured here that made gathering a batch of
images five times slower than copying the same bytes into memory already in use.

:class:`BatchBuffers` keeps the last few output arrays of each shape. When a sample asks
for an array and one of the kept arrays has no reference left but the pool's own (the
learner dropped the batch, and no view, tensor or pending send holds it), that array is
written again instead of a new one. A batch the caller still holds, or any view of it, is
never touched. Arrays smaller than :data:`MIN_BYTES` are always allocated fresh (small
allocations are cheap and reuse their memory already).
"""

from __future__ import annotations

import math
import sys

import numpy as np

MIN_BYTES = 1 << 20  # arrays below this size are not kept
KEEP = 4  # arrays kept per (shape, dtype)


def _refcount_at(arrays: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(arrays[i])


# What _refcount_at reports for an array held by nothing but its list (measured, since
# the count of temporary references depends on the interpreter).
_ONLY_LISTED = _refcount_at([np.empty(1)], 0)


def _spare_index(arrays: list[np.ndarray]) -> int:
    """Index of an array referred to only by ``arrays`` (-1 if none)."""
    for i in range(len(arrays)):
        if _refcount_at(arrays, i) <= _ONLY_LISTED:
            return i
    return -1


class BatchBuffers:
    """Output arrays of one table's samples (call with the table's lock held).

    Memory: up to ``KEEP`` arrays per output shape stay allocated while the table lives,
    each at least ``MIN_BYTES``.
    """

    def __init__(self) -> None:
        self._kept: dict[tuple, list[np.ndarray]] = {}

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype`` that no one else holds."""
        if not isinstance(dtype, np.dtype):
            dtype = np.dtype(dtype)
        if dtype.itemsize * math.prod(shape) < MIN_BYTES:
            return np.empty(shape, dtype)
        kept = self._kept.setdefault((shape, dtype), [])
        i = _spare_index(kept)
        if i >= 0:
            return kept[i]
        out = np.empty(shape, dtype)
        kept.append(out)
        if len(kept) > KEEP:
            del kept[0]
        return out

    def clear(self) -> None:
        """Drop every kept array (their memory goes back once no batch holds them)."""
        self._kept.clear()
