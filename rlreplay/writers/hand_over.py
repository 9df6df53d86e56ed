"""When an adder's completed rows and items go to its writer: staged, then in bulk.

Pieces (an environment's completed rows and their items) are staged and handed over every
``every`` adder calls, joined into as few writer calls as ``history`` allows; the writer
receives the same rows and items, in the same order per table, as with ``every=1``. This
relies on every writer call that raises :class:`~rlreplay.errors.ReplayTimeoutError`
taking nothing of its input. See docs/adders.md.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.core.rate_limiters import insert_pack
from rlreplay.core.specs import unflatten
from rlreplay.errors import ReplayTimeoutError, check_count

if TYPE_CHECKING:
    from rlreplay.runtime.interfaces import Writer

Job = tuple[Any, int, np.ndarray, np.ndarray]


class Chunk:
    """The writer work of one flush of one environment's episode rows.

    Args:
        rows: flat path to ``[k, ...]`` rows to append (``None``: nothing to append).
        switch: end the writer's episode first (the rows continue another stream).
        jobs: ``(table, span, starts, extents)`` items per table, ``starts`` from the last row.
    """

    __slots__ = ("appended", "jobs", "jobs_done", "owned", "rows", "switch")

    def __init__(
        self,
        rows: dict[str, np.ndarray] | None,
        switch: bool,
        jobs: list[Job],
        owned: bool = False,
    ):
        self.rows = rows
        self.switch = switch
        self.jobs = jobs
        self.owned = owned  # the rows are the chunk's own, not views of a staging buffer
        self.appended = rows is None
        self.jobs_done = 0  # jobs whose items all exist

    def detach(self) -> Chunk:
        """Own the rows (the staging buffer they view will be reused)."""
        if self.rows is not None and not self.appended and not self.owned:
            self.rows = {p: np.array(a) for p, a in self.rows.items()}
            self.owned = True
        return self


class ChunkWriter:
    """Hands :class:`Chunk` s to a writer in the order they are submitted.

    While a chunk is pending, later chunks queue behind it and the writer is not called
    again in the same adder call, so one call waits at most one ``timeout``.

    Args:
        writer: the adder's writer.
        priority: priority of new items (``None``: each table's default).
        timeout: seconds each writer call may wait.
    """

    def __init__(self, writer: Writer, priority: float | None, timeout: float | None):
        self.writer = writer
        self.priority = priority
        self.timeout = timeout
        self.pending: deque[Chunk] = deque()
        self.failure: ReplayTimeoutError | None = None
        self.items_created = 0

    def submit(self, chunk: Chunk) -> None:
        """Hand ``chunk`` to the writer now, or queue it behind pending ones."""
        if self.pending or self.failure is not None:
            self.pending.append(chunk.detach())
            return
        try:
            self._run(chunk, self.timeout)
        except ReplayTimeoutError as exc:
            self.pending.append(chunk.detach())
            self.failure = exc

    def drain(self, timeout: float | None) -> None:
        """Hand the pending chunks over, oldest first, until one times out again."""
        self.failure = None
        while self.pending:
            try:
                self._run(self.pending[0], timeout)
            except ReplayTimeoutError as exc:
                self.failure = exc
                return
            self.pending.popleft()

    def raise_failure(self) -> None:
        """Re-raise this call's writer timeout, if any, as its own type with a message saying what
        the adder kept (the call's step is kept)."""
        exc, self.failure = self.failure, None
        if exc is None:
            return
        note = (
            f"{exc}; the adder recorded the step and keeps {len(self.pending)} chunk(s) of "
            "rows and items that its next call (or flush/close) hands to the writer first: "
            "do not repeat the step"
        )
        try:
            error = type(exc)(note)
        except TypeError:
            raise exc from None
        raise error from exc

    def _run(self, chunk: Chunk, timeout: float | None) -> None:
        """Do what is left of ``chunk``, recording progress as each part succeeds."""
        writer = self.writer
        if not chunk.appended:
            if chunk.switch:
                writer.end_episode()
            writer.append_batch(unflatten(chunk.rows), timeout=timeout)
            chunk.appended = True
        while chunk.jobs_done < len(chunk.jobs):
            table, span, starts, extents = chunk.jobs[chunk.jobs_done]
            lengths = None if bool((extents == span).all()) else extents
            writer.create_items(
                table, self.priority, starts=starts, lengths=lengths, timeout=timeout
            )
            self.items_created += len(starts)
            chunk.jobs_done += 1


class ChunkBatch:
    """The writer work of the pieces an adder staged, joined into as few chunks as allowed.

    Joined pieces give the store the same rows and items as one chunk per piece. The chunks
    :meth:`take` returns view the staging buffer, reused by the next :meth:`add`, so a waiting
    chunk copies its rows (:meth:`Chunk.detach`). A table whose limiter admits fewer items at
    once (:meth:`~rlreplay.core.rate_limiters.RateLimiter.insert_window`) gets consecutive
    packs (:func:`~rlreplay.core.rate_limiters.insert_pack`): a larger call would deadlock.

    Args:
        limit: rows a chunk may reach back (the writer's ``history``).
        max_items: items one ``create_items`` call may hold (the adder's ``chunk_length``).
        tables: the writer's tables (for ``max_size`` and rate limiters).
        fields: path to ``(shape, dtype)`` of the staged rows.
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
        # Local tables whose limiter never blocks inserts, and others' insert packs.
        self._unlimited: set[str] = set()
        self._windows: dict[str, int] = {}
        for t in tables:
            window = getattr(getattr(t, "rate_limiter", None), "insert_window", None)
            window = window() if window is not None else None
            if window is None:
                continue
            if math.isinf(window):
                self._unlimited.add(t.name)
                continue
            pack = int(insert_pack(window))
            if pack < self._sizes.get(t.name, pack + 1):
                self._windows[t.name] = pack
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
        """Staging views for the next piece's ``n`` rows; fill, then :meth:`add` with ``rows=n``."""
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
        """Add one piece: ``rows`` (arrays to copy, or a count filled via :meth:`reserve`) and its
        ``jobs``, ``starts`` relative to the piece's last row and ascending."""
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
        """Add consecutive pieces at once, as :meth:`add` of each would.

        ``starts`` are relative to the last piece's last row; ``counts`` are the items per piece.
        Returns ``False`` and adds nothing if they would not fit one chunk."""
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
        """Put pieces into the open chunk."""
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
        """``jobs`` cut into packs of their table's insert window."""
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
        """Items one ``create_items`` call for ``table`` may hold."""
        name = getattr(table, "name", table)
        cap = sum(counts) if name in self._unlimited else max(self.max_items, max(counts))
        size = self._sizes.get(name)
        if size is not None and size > 0:
            cap = min(cap, size)
        return cap

    def take(self) -> list[Chunk]:
        """The chunks staged so far, oldest first (viewing the stage until the next :meth:`add`)."""
        if self.empty:
            return []
        self._close()
        chunks, self._chunks = self._chunks, []
        self._used = 0
        self._reset()
        return chunks


def _packs(counts: list[int], cap: int) -> list[tuple[int, int]]:
    """Consecutive runs ``[lo, hi)`` of pieces holding at most ``cap`` items each."""
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


DEFAULT_EVERY = 16


def check_every(every: Any, batched: bool) -> int:
    """The ``hand_over_every`` to use: ``every`` checked (an int >= 1, else
    InvalidArgumentError), or the default (:data:`DEFAULT_EVERY` with a batch axis, else 1)."""
    if every is None:
        return DEFAULT_EVERY if batched else 1
    return check_count(
        every,
        "hand_over_every",
        "adder calls that stage completed rows before handing them to the writer; None: "
        "the default",
    )


class HandOver:
    """Stages an adder's pieces and hands them to its writer every ``every`` calls.

    Args:
        writer: the adder's writer.
        priority: priority of new items (``None``: each table's default).
        timeout: seconds each writer call may wait.
        reach: rows a joined chunk may reach back (the writer's ``history``).
        chunk_length: the adder's ``chunk_length``.
        every: adder calls a staged piece may wait.
        rows_per_call: the adder's ``num_envs`` (``every`` times it fills the stage).
        fields: path to ``(shape, dtype)`` of the stored rows.
    """

    def __init__(
        self,
        writer: Writer,
        priority: float | None,
        timeout: float | None,
        *,
        reach: int,
        chunk_length: int,
        every: int,
        rows_per_call: int,
        fields: dict[str, tuple[tuple[int, ...], np.dtype]],
    ):
        self.chunks = ChunkWriter(writer, priority, timeout)
        self.batch = ChunkBatch(reach, chunk_length, writer.tables, fields)
        self.every = every
        self.max_rows = every * rows_per_call
        self._calls = 0  # adder calls since the oldest staged piece or recorded call
        # Recorded but unsettled calls (an n-step adder's NStepBlock, or None).
        self.deferred: Any = None
        # (env, first row kept) to drop from the adder's buffers once staged
        self.drops: list[tuple[int, int]] = []

    @property
    def staged_rows(self) -> int:
        """Rows staged and not yet handed to the writer."""
        return self.batch.staged_rows

    def reserve(self, n: int) -> dict[str, np.ndarray]:
        """Where the next piece's ``n`` rows go (see :meth:`ChunkBatch.reserve`)."""
        return self.batch.reserve(n)

    def stage(
        self,
        rows: dict[str, np.ndarray] | int | None,
        switch: bool,
        jobs: list[tuple[Any, int, np.ndarray, np.ndarray]],
    ) -> None:
        """Stage one piece (see :meth:`ChunkBatch.add`)."""
        self.batch.add(rows, switch, jobs)

    def release(self, rows: Any) -> None:
        """Drop rows the adder no longer needs from ``rows`` (staged pieces hold copies)."""
        for i, row in self.drops:
            rows.keep_from(i, row)
        self.drops.clear()

    def end_call(self, force: bool) -> None:
        """End an adder call: hand staged pieces over if ``force``, after ``every`` calls, or when
        the stage is full; a timeout is kept for :meth:`ChunkWriter.raise_failure`."""
        recorded = self.deferred is not None and self.deferred.calls > 0
        if self.batch.empty and not recorded:
            self._calls = 0
            return
        self._calls += 1
        if force or self._calls >= self.every or self.batch.staged_rows >= self.max_rows:
            self._calls = 0
            if recorded:
                self.deferred.settle()
            for chunk in self.batch.take():  # (their rows view the stage: handed over now)
                self.chunks.submit(chunk)
