"""A large index's per-item state, written into its checkpoint files a slice at a time.

Slices are copied under the lock into two reusable buffers and written by a thread;
entries changed meanwhile are patched in at the end, so memory stays bounded whatever
the number of items. See docs/checkpoints.md.
"""

from __future__ import annotations

import contextlib
import os
import time
import zlib
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.checkpoint.manifest import (
    FileBacked,
    entry,
    flatten_state,
    npy_header,
    state_file_name,
)
from rlreplay.core.slot_changes import SlotChanges, changed_entries
from rlreplay.core.storage import StepStore
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
    """One state array's ``.npy`` file: entries written at their offsets, then finished.

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
        """Apply the patches a block at a time, checksum, fsync and close; the manifest entry."""
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


def _address(arr: np.ndarray) -> int:
    """The address of ``arr``'s first byte."""
    return int(arr.__array_interface__["data"][0])


@dataclass(frozen=True)
class Target:
    """Where a part's entries go in one file: part entry ``r`` is file entry ``r - shift``."""

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
        """Keep the part's changed ``entries`` and their ``rows`` for finishing; the bytes kept."""
        lo, hi = np.searchsorted(entries, (self.shift, self.shift + self.file.length))
        if hi <= lo:
            return 0
        values = self.values(rows[lo:hi])
        self.file.patches.append((entries[lo:hi] - self.shift, values))
        return values.nbytes + 8 * int(hi - lo)


def locate(arr: np.ndarray, copy: np.ndarray) -> tuple[int, int, int] | None:
    """``(shift, offset, entries)`` of ``arr`` against a part's ``copy``; None if disjoint.

    Raises:
        CheckpointError: for an array that lies across a part's entries.
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


BUFFERS = 2  # slice buffers: one copied into under the lock while the other is written
# A slice this small is written by the step itself (a hand-over would cost more).
INLINE_BYTES = 256 << 10


@dataclass
class Part:
    """A part of an index's state (see :meth:`Selector.state_parts`) and its files."""

    source: np.ndarray
    per_entry: int
    targets: list[Target]
    index: Any  # the ItemIndex it belongs to
    row_bytes: int
    step: int  # entries per slice
    moment: tuple | None = None  # (changed entries or None for all, their rows)


class StateStream:
    """The per-item state of one store's large indexes, written into files a slice per step.

    Args:
        directory: where the files are made.
        slice_bytes: the most bytes one step copies under the store's lock.

    Attributes:
        peak_bytes: the most bytes of per-item state held in memory at once.
        held_s: the longest lock hold of one step, in seconds.
    """

    def __init__(self, store: StepStore, directory: Path, slice_bytes: int):
        self.store = store
        self.directory = directory
        self.slice_bytes = max(1, int(slice_bytes))
        self.files: dict[str, StateFile] = {}
        self.parts: list[Part] = []
        self.work: list[tuple[int, int]] = []  # (part, first entry), the next one last
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlreplay-state-files")
        self._buffers: list[np.ndarray] = []
        self._writing: list[Future | None] = []  # the last write from each buffer
        self._turn = 0
        self._moment_writes: list[Future] = []
        self._held = 0  # bytes of values kept for finish(), and of buffers
        self.peak_bytes = 0
        self.held_s = 0.0
        self._closed = False

    def add(self, index: Any, out: dict[str, Any], parts: list[tuple], prefix: str) -> None:
        """Make the files of ``out``'s arrays that ``parts`` fill, name them, plan slices.

        Raises:
            OSError: if a file cannot be made.
            CheckpointError: if the parts do not cover an array they reach.
        """
        arrays: dict[str, np.ndarray] = {}
        flatten_state({"index": out}, prefix, arrays)
        found: list[list[tuple[int, int, str]]] = [[] for _ in parts]
        for name, arr in arrays.items():
            if arr.ndim != 1 or not len(arr):
                continue
            hits = [(i, locate(arr, copy)) for i, (_, copy, _) in enumerate(parts)]
            hits = [(i, h) for i, h in hits if h is not None]
            if not hits:
                continue  # not filled by parts: kept in memory, written as any array
            if sum(h[2] for _, h in hits) != len(arr):
                raise CheckpointError(f"the parts of {name} do not cover it once")
            self.files[name] = StateFile(self.directory / name, arr.dtype, len(arr))
            for i, (shift, offset, _) in hits:
                found[i].append((shift, offset, name))
        file_backed(out, f"{prefix}.index", self.files)
        for (source, _, per_entry), targets in zip(parts, found):
            row = max(1, source[:1].nbytes)
            step = max(1, self.slice_bytes // row)
            made = [Target(self.files[n], s, o) for s, o, n in targets]
            self.parts.append(Part(source, per_entry, made, index, row, step))

    def plan(self) -> None:
        """Queue every slice of every part added; again to start over."""
        self.work = []
        for p, part in enumerate(self.parts):
            self.work.extend((p, a) for a in range(0, len(part.source), part.step))
        self.work.sort(reverse=True)

    def _next_buffer(self) -> np.ndarray:
        """The buffer the next slice goes into (its last write waited for)."""
        i = self._turn % BUFFERS
        self._turn += 1
        if i == len(self._buffers):
            size = max(self.slice_bytes, max(p.row_bytes for p in self.parts))
            buf = np.empty(-(-size // 8) * 8, np.uint8)
            buf.fill(0)  # np.zeros maps pages lazily: touch them now, not under the lock
            self._buffers.append(buf)
            self._writing.append(None)
            self._account(self._buffers[i].nbytes)
        f = self._writing[i]
        if f is not None:
            f.result()  # a write that failed fails the save
        return self._buffers[i]

    def step(self) -> None:
        """Copy the next slice under the store's lock and hand it to the writer thread."""
        p, a = self.work.pop()
        part = self.parts[p]
        b = min(len(part.source), a + part.step)
        buf = self._next_buffer()
        rows = buf[: (b - a) * part.row_bytes].view(part.source.dtype)
        rows = rows.reshape(b - a, *part.source.shape[1:])
        with self.store.mutex:
            t0 = time.perf_counter()
            np.copyto(rows, part.source[a:b])
            restarted = self._restart_if_reset()
            self.held_s = max(self.held_s, time.perf_counter() - t0)
        if rows.nbytes <= INLINE_BYTES:
            put(part.targets, a, rows)
        else:
            self._writing[(self._turn - 1) % BUFFERS] = self._pool.submit(
                put, part.targets, a, rows
            )
        if restarted:
            self.plan()

    def _restart_if_reset(self) -> bool:
        """After a reset or restore of an index, note changes afresh and copy every slice again."""
        indexes = {id(p.index): p.index for p in self.parts}.values()
        if not any(ix.changes.everything for ix in indexes):
            return False
        for ix in indexes:
            ix.changes = SlotChanges(ix.capacity)
        return True

    def moment(self, index: Any, out: dict[str, Any], into: dict[str, Any]) -> dict[str, Any]:
        """Copy ``index``'s changed entries (lock held) and finish ``out``; returns the state."""
        slots = index.take_changes()
        for part in self.parts:
            if part.index is not index:
                continue
            at = changed_entries(len(part.source), part.per_entry, slots)
            if at is None:
                part.moment = (None, part.source.copy())
            elif len(at):
                part.moment = (at, part.source[at])
            else:
                part.moment = None
        return index.finish_scalars(out, into, True)

    def after_moment(self) -> None:
        """Hand the moment's copies to the files (outside the lock)."""
        for part in self.parts:
            taken, part.moment = part.moment, None
            if taken is None:
                continue
            at, rows = taken
            self._account(rows.nbytes + (0 if at is None else at.nbytes))
            if at is None:
                self._moment_writes.append(self._pool.submit(put, part.targets, 0, rows))
            else:
                for t in part.targets:
                    self._account(t.patch(at, rows))

    def finish(self) -> dict[str, dict[str, Any]]:
        """Wait for every write and finish every file; their manifest entries by file name.

        Raises:
            OSError: if a write failed.
        """
        for f in [*self._writing, *self._moment_writes]:
            if f is not None:
                f.result()
        entries = {name: file.finish() for name, file in self.files.items()}
        self.close()
        return entries

    def close(self) -> None:
        """Stop the writer thread and close the files."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)
            for file in self.files.values():
                file.close()
            self._buffers = []

    def _account(self, nbytes: int) -> None:
        self._held += nbytes
        self.peak_bytes = max(self.peak_bytes, self._held)
