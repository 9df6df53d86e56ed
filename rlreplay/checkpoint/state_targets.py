"""Where a part of an index's state goes in its checkpoint's state files.

A checkpoint of a large index copies its per-slot arrays as *parts* (see
:meth:`~rlreplay.core.selectors.base.Selector.state_parts`): a part is an array of
entries (a slot's record, a tree level's node) whose copy is an array of the index's
state (never filled, so it takes no memory) or a view into one (a tree level into its
tree's flat array, the records' fields into the record buffer). Where each state array
lies against a part's copy (:func:`locate`) says which of the part's entries, and which
bytes of each, go into that array's file: a :class:`Target`, which writes a slice of the
part's entries there (:func:`put`) or keeps the entries changed at the moment as patches
for the file. :func:`file_backed` puts the files' names in the state in place of the
arrays they hold, as the manifest lists them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.checkpoint.manifest import FileBacked, state_file_name
from rlreplay.checkpoint.npy_offsets import StateFile
from rlreplay.errors import CheckpointError

__all__ = ["Target", "file_backed", "locate", "put"]


def _address(arr: np.ndarray) -> int:
    """The address of ``arr``'s first byte."""
    return int(arr.__array_interface__["data"][0])


@dataclass(frozen=True)
class Target:
    """Where a part's entries go in one file: part entry ``r`` is file entry
    ``r - shift``, from byte ``offset`` of the part's entry on."""

    file: StateFile
    shift: int
    offset: int

    def values(self, rows: np.ndarray) -> np.ndarray:
        """This file's values in ``rows`` (whole entries of the part, C-ordered)."""
        size = self.file.dtype.itemsize
        raw = rows.reshape(len(rows), -1).view(np.uint8)[:, self.offset : self.offset + size]
        return np.ascontiguousarray(raw).view(self.file.dtype).reshape(-1)

    def put(self, first: int, rows: np.ndarray) -> None:
        """Write ``rows``, the part's entries ``first`` on, where they fall in the file."""
        lo = max(first, self.shift)
        hi = min(first + len(rows), self.shift + self.file.length)
        if hi > lo:
            self.file.put(lo - self.shift, self.values(rows[lo - first : hi - first]))

    def patch(self, entries: np.ndarray, rows: np.ndarray) -> int:
        """Keep the part's changed ``entries`` (sorted) and their ``rows`` for
        :meth:`StateFile.finish`; returns the bytes kept."""
        lo, hi = np.searchsorted(entries, (self.shift, self.shift + self.file.length))
        if hi <= lo:
            return 0
        values = self.values(rows[lo:hi])
        self.file.patches.append((entries[lo:hi] - self.shift, values))
        return values.nbytes + 8 * int(hi - lo)


def locate(arr: np.ndarray, copy: np.ndarray) -> tuple[int, int, int] | None:
    """``(shift, offset, entries)`` of state array ``arr`` against a part's ``copy``:
    part entry ``r`` holds ``arr[r - shift]`` at byte ``offset`` of the entry; ``None``
    when they share no memory.

    Raises:
        CheckpointError: for an array that lies across a part's entries (a selector
            whose parts do not match its state).
    """
    row = copy[:1].nbytes if len(copy) else 1
    c0, c1 = _address(copy), _address(copy) + copy.nbytes
    a0 = _address(arr)
    a1 = a0 + (len(arr) - 1) * arr.strides[0] + arr.itemsize
    if a0 >= c1 or c0 >= a1:
        return None
    if (
        not copy.flags.c_contiguous
        or arr.itemsize > row
        or (len(arr) > 1 and arr.strides[0] != row)
        or (a0 - c0) % row + arr.itemsize > row
    ):
        raise CheckpointError(
            f"a state array ({arr.dtype}, strides {arr.strides}) lies across the entries of "
            f"a part of {row} bytes: the selector's state_parts do not match its state"
        )
    offset = (a0 - c0) % row
    shift = (a0 - c0 - offset) // row
    entries = min(len(copy), shift + len(arr)) - max(0, shift)
    return shift, offset, entries


def put(targets: list[Target], first: int, rows: np.ndarray) -> None:
    """Write ``rows``, a part's entries ``first`` on, into each of its ``targets``."""
    for t in targets:
        t.put(first, rows)


def file_backed(state: dict[str, Any], prefix: str, files: Mapping[str, StateFile]) -> None:
    """Replace the arrays of ``state`` written into ``files`` by their names."""
    for key, value in state.items():
        name = state_file_name(prefix, key)
        if isinstance(value, np.ndarray) and name in files:
            state[key] = FileBacked(name)
        elif isinstance(value, dict):
            file_backed(value, f"{prefix}.{key}", files)
