"""A ``.npy`` file of one array, written at entry offsets in any order, then finished.

A checkpoint writes a large index's per-item arrays a slice at a time, in the order the
slices are copied, and then the entries that changed before the moment over them
(:mod:`~rlreplay.checkpoint.state_files`). :class:`StateFile` is such a file: made at
its full size with its header, written with ``pwrite`` at each slice's offset, and
finished by reading it back a block at a time, putting the changed entries into each
block, writing back the blocks they changed and computing the checksum over the final
bytes, then fsynced. Reading back and patching take one block of memory, whatever the
file's size.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.checkpoint.manifest import entry, npy_header
from rlreplay.errors import CheckpointError

FINISH_BYTES = 2 << 20  # a file is read back, patched and checksummed this much at a time


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _pread(fd: int, into: memoryview, offset: int) -> None:
    while len(into):
        n = os.preadv(fd, [into], offset)
        if n <= 0:
            raise CheckpointError(f"a checkpoint state file ended early at byte {offset}")
        into, offset = into[n:], offset + n


class StateFile:
    """One state array's ``.npy`` file: entries written at their offsets in any order
    (:meth:`put`), then :meth:`finish`\\ ed with the changed entries of the moment.

    Args:
        path: the file to create (exclusively).
        dtype, length: the array's.
    """

    def __init__(self, path: Path, dtype: np.dtype, length: int):
        self.dtype = np.dtype(dtype)
        self.length = int(length)
        self.header = npy_header((self.length,), self.dtype)
        self.nbytes = len(self.header) + self.length * self.dtype.itemsize
        self.patches: list[tuple[np.ndarray, np.ndarray]] = []  # (sorted entries, values)
        self.fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _pwrite(self.fd, memoryview(self.header), 0)
            os.ftruncate(self.fd, self.nbytes)
        except BaseException:
            self.close()
            raise

    def put(self, first: int, values: np.ndarray) -> None:
        """Write ``values`` (contiguous, of this file's dtype) at entries ``first`` on."""
        assert self.fd is not None
        data = memoryview(values.reshape(-1).view(np.uint8))
        _pwrite(self.fd, data, len(self.header) + first * self.dtype.itemsize)

    def finish(self) -> dict[str, Any]:
        """Apply the patches (a block at a time: read, patch, write back), checksum the
        final bytes, fsync and close; returns the file's manifest entry."""
        assert self.fd is not None
        rows = max(1, FINISH_BYTES // self.dtype.itemsize)
        block_buffer = np.empty(min(rows, self.length), self.dtype)
        crc = zlib.crc32(self.header)
        for e0 in range(0, self.length, rows):
            e1 = min(self.length, e0 + rows)
            block = block_buffer[: e1 - e0]
            view = memoryview(block.view(np.uint8))
            offset = len(self.header) + e0 * self.dtype.itemsize
            _pread(self.fd, view, offset)
            patched = False
            for entries, values in self.patches:
                lo, hi = np.searchsorted(entries, (e0, e1))
                if hi > lo:
                    block[entries[lo:hi] - e0] = values[lo:hi]
                    patched = True
            if patched:
                _pwrite(self.fd, view, offset)
            crc = zlib.crc32(view, crc)
        os.fsync(self.fd)
        self.close()
        return entry(self.nbytes, crc, self.dtype, (self.length,))

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
