"""Streaming a store's columns to disk as they were at one moment, while serving goes on.

A checkpoint takes the small per-item state of its tables under the store's lock, then
streams the step columns without holding it for long: :class:`ColumnStream` copies a
chunk of rows (a few MB) under the lock into a reused buffer, releases the lock, and
writes the chunk (with its checksum) to the column's ``.npy`` file; rows go in file order,
so each file is written front to back.

Writes go on meanwhile. The stream is installed as the store's ``guard``: before the
store writes rows (any append, insert, writer chunk or relocation) it calls
:meth:`ColumnStream.before_write`, which copies aside the rows about to change that the
stream has not written yet. Writes after the checkpoint's moment overwrite rows in
ring order from ``base % capacity`` on (``base`` being the store's next id then), so the
rows copied aside are the first ``W`` in that order, ``W`` the writes since the moment
(at most ``capacity``); they are kept in blocks indexed by that order. A chunk's row
comes from the aside copy if it was overwritten, from the column otherwise. A reset of
the store copies every row not yet streamed aside at once. So every file holds exactly
the column at the checkpoint's moment, and the extra memory is the rows overwritten
ahead of the stream (none when nothing is written during the checkpoint).
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
from rlreplay.core.storage import StepStore

_BLOCK_BYTES = 4 << 20  # the aside copy is kept in blocks of about this many bytes
CHUNK_BYTES = 2 << 20  # rows copied under the store's lock at a time (and written at once)


class ColumnStream:
    """The columns of ``store`` as of construction (call with the store's lock held),
    written by :meth:`write` into ``files`` (field path to file path).

    Attributes:
        aside_peak_bytes: the most bytes the aside copies held at once.
        held_s: the longest time one chunk's copy held the store's lock, in seconds.
    """

    def __init__(self, store: StepStore, files: dict[str, Path], chunk_bytes: int | None = None):
        self.store = store
        self.files = files
        self.capacity = cap = store.capacity
        self.base = store.next_id
        self.start = self.base % cap  # the row the first write after the moment changes
        self.row_bytes = sum(c[:1].nbytes for c in store.columns.values()) or 1
        chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        self.chunk_rows = max(1, min(cap, chunk_bytes // self.row_bytes))
        self.block_rows = max(16, min(4096, _BLOCK_BYTES // self.row_bytes))
        self.done = 0  # rows [0, done) are copied out of the store
        self.overwritten = 0  # W: rows, in ring order from ``start``, written since the moment
        self.blocks: dict[int, dict[str, np.ndarray]] = {}
        self.reset_copy: dict[str, np.ndarray] | None = None  # rows [done, cap) at a reset
        self.reset_from = cap
        self.aside_bytes = 0
        self.aside_peak_bytes = 0
        self.held_s = 0.0

    # ------------------------------------------------------------ store hooks (lock held)
    def before_write(self, first: int, n: int) -> None:
        """Copy aside the rows ids ``[first, first + n)`` overwrite that the stream still
        needs (called by the store before it writes them)."""
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
            if row + (stop - k) > done:  # some of these rows are not streamed yet
                self._keep(block, k, row, stop - k)
            k = stop
        self.overwritten = k1

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

    # ------------------------------------------------------------------- the stream
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
        """One chunk's rows per column, touched here so that no copy under the lock
        faults pages in."""
        bufs = {
            p: np.empty((self.chunk_rows, *c.shape[1:]), c.dtype)
            for p, c in self.store.columns.items()
        }
        for buf in bufs.values():
            buf.reshape(-1).view(np.uint8).fill(0)
        return bufs

    def write(self, progress: Callable[[int], None] | None = None) -> dict[str, dict]:
        """Write every column's file; returns their manifest entries. Takes the store's
        lock for each chunk's copy only. Two sets of chunk buffers: while a second
        thread writes one chunk to the files (and checksums it), this one copies the
        next; ``progress`` is called from that second thread."""
        store = self.store
        cap = self.capacity
        columns = store.columns
        sets = [self._buffers(), self._buffers()]
        crcs, sizes = {}, {}
        with contextlib.ExitStack() as files:
            handles = {p: files.enter_context(open(self.files[p], "wb")) for p in columns}
            for path, col in columns.items():
                header = npy_header(col.shape, col.dtype)
                handles[path].write(header)
                crcs[path], sizes[path] = zlib.crc32(header), len(header)

            def emit(bufs: dict[str, np.ndarray], n: int) -> None:
                for path, f in handles.items():
                    data = memoryview(bufs[path][:n].reshape(-1).view(np.uint8))
                    f.write(data)
                    crcs[path] = zlib.crc32(data, crcs[path])
                    sizes[path] += len(data)
                    if progress is not None:
                        progress(len(data))

            with ThreadPoolExecutor(1) as pool:
                written: list[Future] = []
                r0 = 0
                while r0 < cap:
                    r1 = min(cap, r0 + self.chunk_rows)
                    bufs = sets[len(written) % 2]
                    if len(written) >= 2:
                        written[-2].result()  # that chunk is on its way: its buffers are free
                    with store.mutex:
                        t0 = time.perf_counter()
                        self._copy_chunk(r0, r1, bufs)
                        self.done = r1
                        self._release(r1)
                        self.held_s = max(self.held_s, time.perf_counter() - t0)
                    written.append(pool.submit(emit, bufs, r1 - r0))
                    r0 = r1
                for future in written[-2:]:
                    future.result()
            for f in handles.values():
                f.flush()
                os.fsync(f.fileno())
        return {
            path: entry(sizes[path], crcs[path], col.dtype, col.shape)
            for path, col in columns.items()
        }
