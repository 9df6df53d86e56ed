"""Output arrays for sampled batches, reused once nothing outside refers to them.

Reuse avoids fresh memory's page faults; a batch or view the caller still holds is never
touched.
"""

from __future__ import annotations

import math
import sys

import numpy as np

MIN_BYTES = 1 << 20  # arrays below this size are not kept
KEEP = 4  # arrays kept per (shape, dtype)


def _refcount_at(arrays: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(arrays[i])


# What _refcount_at reports for an array held only by its list (measured: interpreters differ).
_ONLY_LISTED = _refcount_at([np.empty(1)], 0)


def _spare_index(arrays: list[np.ndarray]) -> int:
    """Index of an array referred to only by ``arrays`` (-1 if none)."""
    for i in range(len(arrays)):
        if _refcount_at(arrays, i) <= _ONLY_LISTED:
            return i
    return -1


class BatchBuffers:
    """Output arrays of one table's samples (call with the table's lock held).

    Up to ``KEEP`` arrays of at least ``MIN_BYTES`` per output shape stay allocated.
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
