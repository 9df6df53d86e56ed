"""Joining the pieces an adder staged into as few writer chunks as the writer allows.

An adder stages *pieces* (one environment's completed rows and the items over them) and
hands them to its writer together (:mod:`rlreplay.writers.hand_over`). Each writer call
has a fixed cost far above its cost per row, so :class:`ChunkBatch` joins consecutive
pieces into one :class:`~rlreplay.writers.chunk_writer.Chunk` (one ``append_batch`` and
one ``create_items`` per table), within what the writer's history reaches back and what
each table's rate limiter admits in one call. How chunks then reach the writer across
timeouts is :class:`~rlreplay.writers.chunk_writer.ChunkWriter`'s part.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from rlreplay.writers.chunk_writer import Chunk, Job


class ChunkBatch:
    """The writer work of the pieces an adder staged, joined into as few chunks as the
    writer allows.

    Each environment's part (a *piece*: its rows, whether they continue the previous
    piece's stream, the items over them) is added here, its rows copied into the batch's
    staging buffer (one slice copy per field), and consecutive pieces are joined into one
    :class:`Chunk`: one ``append_batch`` of their rows one after another and one
    ``create_items`` per table. The store then holds exactly the rows and items it would
    hold with one chunk per piece: a piece that does not continue the one before it
    already carries the context rows its items need, and item starts, relative to the
    piece's last row, are shifted by the rows appended after it in the same chunk. Only
    the writer's episode marks differ: ``end_episode`` comes before a chunk, not between
    its pieces, so the writer keeps the earlier pieces' rows retained until the next
    chunk (no item reaches them: a piece that does not continue the one before it has its
    items within its own rows, as it had after ``end_episode``).

    The chunks :meth:`take` returns view the staging buffer, which the next :meth:`add`
    reuses: they are handed over at once, and one that has to wait copies its rows
    (:meth:`Chunk.detach`).

    A chunk reaches back at most ``limit`` rows from its end (rows and item starts alike),
    the history the adder asks of its writer; a piece that would exceed it starts the
    next chunk. One ``create_items`` call holds the items of whole pieces, at most
    ``max_items`` of them or the largest piece's (and at most a table's ``max_size``):
    no more than one environment's chunk creates, so a rate limiter that admits the
    items of one environment's chunk at once admits every call. A local table whose
    limiter never blocks inserts takes all of a chunk's items in one call; one whose
    limiter admits fewer items at once than its ``max_size`` (its
    :meth:`~rlreplay.core.rate_limiters.RateLimiter.insert_window`) takes them in
    consecutive packs of that many, pieces split where a pack ends: a larger call would
    be refused (``DeadlockError``) or wait for samples that could never come. The items
    and their order are the same either way.

    Args:
        limit: rows a chunk may reach back from its end (the writer's ``history``, at
            least the adder's ``capacity``).
        max_items: items one ``create_items`` call may hold (the adder's ``chunk_length``).
        tables: the writer's tables, whose ``max_size`` applies to items of a table given
            by name.
        fields: path to ``(shape, dtype)`` of the rows staged (:meth:`reserve`); rows
            given to :meth:`add` as arrays may bring their own.
    """

    def __init__(
        self,
        limit: int,
        max_items: int,
        tables: Any = (),
        fields: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None,
    ):
        self.limit = limit
        self._fields = dict(fields or {})
        self.max_items = max_items
        self._sizes = {
            t.name: int(t.max_size)
            for t in tables
            if isinstance(getattr(t, "max_size", None), (int, np.integer))
        }
        # Tables whose rate limiter never blocks an insert, and the items the others'
        # admit at once where that is below their max_size (known for local tables only).
        self._unlimited: set[str] = set()
        self._windows: dict[str, int] = {}
        for t in tables:
            window = getattr(getattr(t, "rate_limiter", None), "insert_window", None)
            window = window() if window is not None else None
            if window is None:
                continue
            if math.isinf(window):
                self._unlimited.add(t.name)
            elif window < self._sizes.get(t.name, window + 1):
                self._windows[t.name] = int(window)
        self._chunks: list[Chunk] = []
        self._stage: dict[str, np.ndarray] = {}  # path -> [stage rows, ...]
        self._size = 0  # rows the staging buffer holds (0: not allocated yet)
        self._used = 0  # staged rows, in closed chunks and the open one
        self._reset()

    @property
    def empty(self) -> bool:
        """True when nothing is staged."""
        return not self._pieces and not self._chunks

    @property
    def staged_rows(self) -> int:
        """Rows staged since the last :meth:`take`."""
        return self._used

    def _reset(self) -> None:
        self._first = self._used  # staging row of the open chunk's first row
        self._rows = 0  # rows in the open chunk
        self._reach = 0  # rows the open chunk reaches back from its end
        self._switch = False
        self._pieces: list[tuple[int, list[Any], list[int] | None]] = []

    def reserve(self, n: int) -> dict[str, np.ndarray]:
        """Views of the staging buffer where the next piece's ``n`` rows go: fill them,
        then :meth:`add` the piece with ``rows=n``."""
        used = self._used
        stage = self._stage
        if used + n > self._size:
            size = max(2 * (used + n), 256)
            fields = self._fields.items()
            grown = {p: np.empty((size, *shape), dtype) for p, (shape, dtype) in fields}
            for p, a in stage.items():
                grown[p][:used] = a[:used]  # closed chunks keep viewing the old arrays
            self._stage = stage = grown
            self._size = size
        end = used + n
        return {p: a[used:end] for p, a in stage.items()}

    def add(
        self,
        rows: dict[str, np.ndarray] | int | None,
        switch: bool,
        jobs: list[Job],
    ) -> None:
        """Add one piece: ``rows`` (arrays, copied into the staging buffer now, or the
        number of rows filled in through :meth:`reserve`) and ``jobs`` as :class:`Chunk`
        takes them, ``starts`` relative to the piece's last row and ascending."""
        if isinstance(rows, dict):
            n = len(next(iter(rows.values())))
            for p, a in rows.items():
                self._fields.setdefault(p, (a.shape[1:], a.dtype))
            if n:
                for p, view in self.reserve(n).items():
                    view[...] = rows[p]
        else:
            n = rows or 0
        reach = n
        seen = None
        for _, _, starts, _ in jobs:
            if starts is not seen and len(starts):  # tables often share one starts array
                reach = max(reach, -int(starts[0]))  # starts ascend: the first is the least
                seen = starts
        if self._pieces and max(self._reach + n, reach) > self.limit:
            self._close()
        self._open(n, reach, switch, jobs, None)

    def add_pieces(
        self,
        rows: int,
        switch: bool,
        jobs: list[Job],
        counts: list[int],
    ) -> bool:
        """Add consecutive pieces at once, as :meth:`add` of each would: ``rows`` rows in
        all, filled in through :meth:`reserve`, ``switch`` the first piece's, each job's
        ``starts`` relative to the *last* piece's last row, ``counts`` the items of each
        piece that has items (the same for every table). Returns ``False`` and adds
        nothing when adding them one by one would close a chunk among them (they reach
        back past ``limit``): the caller adds them one by one then."""
        reach = rows
        if jobs and len(jobs[0][2]):
            reach = max(reach, -int(jobs[0][2].min()))
        if max(self._reach + rows, reach) > self.limit:
            return False
        self._open(rows, reach, switch, jobs, counts)
        return True

    def _open(
        self, rows: int, reach: int, switch: bool, jobs: list[Job], counts: list[int] | None
    ) -> None:
        """Put pieces of ``rows`` rows reaching ``reach`` rows back into the open chunk
        (``switch`` is the chunk's when they are its first)."""
        if not self._pieces:
            self._switch = switch
        self._used += rows
        self._rows += rows
        self._reach = max(self._reach + rows, reach)
        self._pieces.append((self._rows, jobs, counts))

    def _close(self) -> None:
        """Turn the open pieces into a chunk."""
        if not self._pieces:
            return
        rows = None
        if self._rows:
            lo, hi = self._first, self._first + self._rows
            rows = {p: a[lo:hi] for p, a in self._stage.items()}
        first = self._pieces[0]
        if len(self._pieces) == 1 and (first[2] is None or len(first[2]) <= 1):
            self._chunks.append(Chunk(rows, self._switch, self._split(first[1])))  # one piece
            self._reset()
            return
        total = self._rows
        merged: dict[int, tuple[Any, int, list[np.ndarray], list[np.ndarray], list[int]]] = {}
        for end, jobs, counts in self._pieces:
            shift = total - end  # rows appended after these pieces in the chunk
            for table, span, starts, extents in jobs:
                job = merged.setdefault(id(table), (table, span, [], [], []))
                job[2].append(starts - shift if shift else starts)
                job[3].append(extents)
                job[4].extend([len(starts)] if counts is None else counts)
        joined = []
        for table, span, starts, extents, counts in merged.values():
            window = self._windows.get(getattr(table, "name", table))
            every_start, every_extent = _join(starts), _join(extents)
            if window is not None:  # consecutive packs the limiter admits
                joined.extend(self._split([(table, span, every_start, every_extent)]))
                continue
            name = getattr(table, "name", table)
            if name in self._unlimited:
                size = self._sizes.get(name)
                if size is None or size <= 0 or size >= len(every_start):
                    joined.append((table, span, every_start, every_extent))  # one pack
                    continue
            bounds = [0, *itertools.accumulate(counts)]
            for lo, hi in _packs(counts, self._cap(table, counts)):
                a, b = bounds[lo], bounds[hi]
                joined.append((table, span, every_start[a:b], every_extent[a:b]))
        self._chunks.append(Chunk(rows, self._switch, joined))
        self._reset()

    def _split(
        self, jobs: list[Job]
    ) -> list[Job]:
        """``jobs`` with those over their table's insert window cut into consecutive
        packs of that many items (views, in order)."""
        out = []
        for table, span, starts, extents in jobs:
            window = self._windows.get(getattr(table, "name", table))
            if window is None or len(starts) <= window:
                out.append((table, span, starts, extents))
                continue
            for lo in range(0, len(starts), window):
                out.append((table, span, starts[lo : lo + window], extents[lo : lo + window]))
        return out

    def _cap(self, table: Any, counts: list[int]) -> int:
        """Items one ``create_items`` call for ``table`` may hold: ``max_items`` or the
        largest piece's items (every item for a table whose limiter never blocks), at
        most the table's ``max_size`` (a piece is never split, so a piece over
        ``max_size`` fails in the writer as it would alone)."""
        name = getattr(table, "name", table)
        cap = sum(counts) if name in self._unlimited else max(self.max_items, max(counts))
        size = self._sizes.get(name)
        if size is not None and size > 0:
            cap = min(cap, size)
        return cap

    def take(self) -> list[Chunk]:
        """The chunks of the pieces added so far, oldest first (their rows view the
        staging buffer until the next :meth:`add`); the batch is empty after."""
        if self.empty:
            return []
        self._close()
        chunks, self._chunks = self._chunks, []
        self._used = 0
        self._reset()
        return chunks


def _packs(counts: list[int], cap: int) -> list[tuple[int, int]]:
    """Consecutive runs ``[lo, hi)`` of pieces, each holding at most ``cap`` items (or one
    piece over ``cap``)."""
    packs, lo, total = [], 0, 0
    for k, n in enumerate(counts):
        if k > lo and total + n > cap:
            packs.append((lo, k))
            lo, total = k, 0
        total += n
    packs.append((lo, len(counts)))
    return packs


def _join(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
