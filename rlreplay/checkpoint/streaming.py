"""Streaming a store's columns to disk as they were at one moment, while serving goes on.

Rows about to be overwritten before they are streamed are copied aside first, so every
file holds exactly the column at the checkpoint's moment. See docs/checkpoints.md.
"""

from __future__ import annotations

import contextlib
import os
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rlreplay.checkpoint.manifest import entry, npy_header
from rlreplay.core.storage import CHECKPOINT_CHUNK_ALIGN, StepStore

_BLOCK_BYTES = 4 << 20  # the aside copy is kept in blocks of about this many bytes
CHUNK_BYTES = 2 << 20  # bytes of rows copied under the store's lock at a time (a piece)


class ColumnStream:
    """The columns of ``store`` as of construction (lock held), written by :meth:`write`.

    Attributes:
        aside_peak_bytes: the most bytes the aside copies held at once.
        held_s: the longest time one piece's copy held the store's lock, in seconds.
    """

    def __init__(
        self, store: StepStore, files: dict[str, list[Path]], chunk_bytes: int | None = None
    ):
        self.store = store
        self.files = files
        self.capacity = cap = store.capacity
        self.file_rows = store.chunk_rows
        self.pending = np.ones(len(store.chunk_generations), bool)
        self.base = store.next_id
        self.start = self.base % cap  # the row the first write after the moment changes
        self.row_bytes = sum(c[:1].nbytes for c in store.columns.values()) or 1
        chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        self.piece_rows = max(1, min(cap, chunk_bytes // self.row_bytes))
        self.block_rows = max(16, min(4096, _BLOCK_BYTES // self.row_bytes))
        self.done = 0  # rows [0, done) are copied out of the store
        self.overwritten = 0  # W: rows, in ring order from ``start``, written since the moment
        self.blocks: dict[int, dict[str, np.ndarray]] = {}
        self.reset_copy: dict[str, np.ndarray] | None = None  # rows [done, cap) at a reset
        self.reset_from = cap
        self.aside_bytes = 0
        self.aside_peak_bytes = 0
        self.held_s = 0.0

    def before_write(self, first: int, n: int) -> None:
        """Copy aside the rows ``[first, first + n)`` will overwrite that the stream still needs."""
        if self.reset_copy is not None:
            return  # everything not yet streamed is kept already
        k0 = max(first - self.base, self.overwritten)
        k1 = min(first + n - self.base, self.capacity)
        if k1 <= k0:
            return
        cap, start, done = self.capacity, self.start, self.done
        k = k0
        while k < k1:
            block = k // self.block_rows
            stop = min(k1, (block + 1) * self.block_rows)
            row = (start + k) % cap
            stop = min(stop, k + cap - row)  # not across the ring's end
            if self._needed(max(row, done), row + (stop - k)):
                self._keep(block, k, row, stop - k)
            k = stop
        self.overwritten = k1

    def _needed(self, lo: int, hi: int) -> bool:
        """Whether rows ``[lo, hi)`` (``lo >= done``) hold some row still to stream."""
        if lo >= hi:
            return False
        fr = self.file_rows
        return bool(self.pending[lo // fr : (hi - 1) // fr + 1].any())

    def skip(self, chunks: np.ndarray) -> None:
        """Do not stream ``chunks`` (reused); call before :meth:`write`."""
        with self.store.mutex:
            self.pending[np.asarray(chunks, np.int64)] = False

    def _keep(self, block: int, k: int, row: int, n: int) -> None:
        rows = self.blocks.get(block)
        if rows is None:
            rows = self.blocks[block] = {
                p: np.empty((self.block_rows, *c.shape[1:]), c.dtype)
                for p, c in self.store.columns.items()
            }
            self.aside_bytes += self.block_rows * self.row_bytes
            self.aside_peak_bytes = max(self.aside_peak_bytes, self.aside_bytes)
        at = k - block * self.block_rows
        for path, col in self.store.columns.items():
            rows[path][at : at + n] = col[row : row + n]

    def before_reset(self) -> None:
        """Keep every row not yet streamed (the store is about to forget its steps)."""
        if self.reset_copy is None:
            self.reset_from = self.done
            self.reset_copy = {p: c[self.done :].copy() for p, c in self.store.columns.items()}
            self.aside_bytes += (self.capacity - self.done) * self.row_bytes
            self.aside_peak_bytes = max(self.aside_peak_bytes, self.aside_bytes)

    def _copy_chunk(self, r0: int, r1: int, out: dict[str, np.ndarray]) -> None:
        """Rows ``[r0, r1)`` as of the moment into ``out`` (lock held)."""
        n = r1 - r0
        for path, col in self.store.columns.items():
            src = (
                self.reset_copy[path][r0 - self.reset_from : r1 - self.reset_from]
                if (self.reset_copy is not None)
                else col[r0:r1]
            )
            out[path][:n] = src
        w = self.overwritten
        if not w:
            return
        k = (np.arange(r0, r1) - self.start) % self.capacity
        changed = np.flatnonzero(k < w)
        if not len(changed):
            return
        kk = k[changed]
        blocks = kk // self.block_rows
        for block in np.unique(blocks).tolist():
            sel = blocks == block
            rows = self.blocks[block]
            for path in out:
                out[path][changed[sel]] = rows[path][kk[sel] - block * self.block_rows]

    def _release(self, upto: int) -> None:
        """Forget the aside blocks whose rows all lie below row ``upto`` (streamed)."""
        cap = self.capacity
        for block in list(self.blocks):
            k0 = block * self.block_rows
            lo = (self.start + k0) % cap
            hi = lo + min(self.block_rows, cap - k0)
            if hi <= upto or upto >= cap:  # (a block across the ring's end needs all rows)
                del self.blocks[block]
                self.aside_bytes -= self.block_rows * self.row_bytes

    def _buffers(self) -> dict[str, np.ndarray]:
        """One piece's rows per column, touched now so no copy under the lock faults pages in."""
        bufs = {
            p: np.empty((self.piece_rows, *c.shape[1:]), c.dtype)
            for p, c in self.store.columns.items()
        }
        for buf in bufs.values():
            buf.reshape(-1).view(np.uint8).fill(0)
        return bufs

    def write(self, progress: Callable[[int], None] | None = None) -> dict[Path, dict]:
        """Write the files of every chunk not skipped; their manifest entries by file path."""
        store = self.store
        cap, fr = self.capacity, self.file_rows
        columns = store.columns
        chunks = np.flatnonzero(self.pending).tolist()
        sets = [self._buffers(), self._buffers()]
        out = Emitter(self.files, columns, fr, cap, progress)
        try:
            with store.mutex:  # rows before the first chunk to stream are never needed
                self.done = max(self.done, chunks[0] * fr if chunks else cap)
                self._release(self.done)
            with ThreadPoolExecutor(1) as pool:
                written: list[Future] = []
                for i, c in enumerate(chunks):
                    c0, c1 = c * fr, min(cap, (c + 1) * fr)
                    after = chunks[i + 1] * fr if i + 1 < len(chunks) else cap
                    for r0 in range(c0, c1, self.piece_rows):
                        r1 = min(c1, r0 + self.piece_rows)
                        bufs = sets[len(written) % 2]
                        if len(written) >= 2:
                            written[-2].result()  # that piece is on its way: buffers free
                        with store.mutex:
                            t0 = time.perf_counter()
                            self._copy_chunk(r0, r1, bufs)
                            if r1 == c1:
                                self.pending[c] = False
                                r1 = after
                            self.done = r1
                            self._release(r1)
                            self.held_s = max(self.held_s, time.perf_counter() - t0)
                        written.append(pool.submit(out.emit, bufs, c, r0, min(r1, c1)))
                for future in written[-2:]:
                    future.result()
        finally:
            out.close()
        return out.entries


class Emitter:
    """Writes a stream's pieces into the chunk files in order; files are opened exclusively."""

    def __init__(
        self,
        files: dict[str, list[Path]],
        columns: dict[str, np.ndarray],
        file_rows: int,
        capacity: int,
        progress: Callable[[int], None] | None,
    ):
        self.files, self.columns = files, columns
        self.file_rows, self.capacity = file_rows, capacity
        self.progress = progress
        self.handles: dict[str, object] = {}
        self.crcs: dict[str, int] = {}
        self.sizes: dict[str, int] = {}
        self.entries: dict[Path, dict] = {}

    def emit(self, bufs: dict[str, np.ndarray], c: int, r0: int, r1: int) -> None:
        """Write rows ``[r0, r1)`` of chunk ``c`` from ``bufs``."""
        c0, c1 = c * self.file_rows, min(self.capacity, (c + 1) * self.file_rows)
        if r0 == c0:
            for path, col in self.columns.items():
                f = self.handles[path] = open(self.files[path][c], "xb")  # noqa: SIM115
                header = npy_header((c1 - c0, *col.shape[1:]), col.dtype, CHECKPOINT_CHUNK_ALIGN)
                f.write(header)
                self.crcs[path], self.sizes[path] = zlib.crc32(header), len(header)
        for path, f in self.handles.items():
            data = memoryview(bufs[path][: r1 - r0].reshape(-1).view(np.uint8))
            f.write(data)
            self.crcs[path] = zlib.crc32(data, self.crcs[path])
            self.sizes[path] += len(data)
            if self.progress is not None:
                self.progress(len(data))
        if r1 == c1:
            for path, f in self.handles.items():
                f.flush()
                os.fsync(f.fileno())
                f.close()
                col = self.columns[path]
                self.entries[self.files[path][c]] = entry(
                    self.sizes[path], self.crcs[path], col.dtype, (c1 - c0, *col.shape[1:])
                )
            self.handles = {}

    def close(self) -> None:
        """Close the files of a chunk left half written (a failed save)."""
        for f in self.handles.values():
            with contextlib.suppress(OSError):
                f.close()
        self.handles = {}
