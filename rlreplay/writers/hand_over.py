"""When an adder's completed rows and items go to its writer: staged, then in bulk.

An adder completes *pieces* (one environment's episode rows and the items over them, see
:class:`ChunkBatch`) as episodes end or chunks fill. A
writer call has a fixed cost far above its cost per row (a store append, an item insert,
the evictions they cause: tens of microseconds for a few rows, about a tenth of a
microsecond per row more), and with many environments short episodes end on almost every
call. So pieces are *staged*: their rows are copied into the batch's staging buffer as
they complete (one slice copy per field; the adder's own buffers are then free to move
on), and the staged pieces are handed to the writer together, joined into as few chunks
as the writer's ``history`` allows, once every ``every`` adder calls.

Bounded delay: a piece staged by an adder call is handed over by that call or one of the
next ``every - 1`` calls (earlier once ``every * num_envs`` rows are staged), and by every
``flush()``, ``end_episode()``, ``reset()`` and ``close()``. Items therefore reach the
table at most ``every - 1`` vector steps after their piece was cut: an n-step row is
complete ``n`` steps after it was taken (once the episode went on past its returns), an
item also reads the row ``n`` steps after its own, and an open episode is cut once it
holds ``chunk_length`` complete rows, so without flushes an item waits at most
``chunk_length + 2n - 1 + every - 1`` steps. With ``every=1`` each call hands over what
it completed.

Staging changes only when the writer is called, never what it receives: the store holds
the same rows and items, in the same order per table, as with ``every=1``.

Staged pieces are joined into as few chunks as the writer allows (:class:`ChunkBatch`:
one ``append_batch`` and one ``create_items`` per table, within what the writer's history
reaches back and what each table's rate limiter admits in one call), and the chunks
reach the writer in order across timeouts (:class:`ChunkWriter`). The writer may time
out (a full queue table, a rate limiter, a server that does not answer). A chunk the
writer timed out on stays pending with what it already did recorded (rows appended,
tables whose items exist), and so do the chunks staged after
it; the next adder call hands them over first. So nothing is
written twice, nothing is lost, and the order of appends and items is the order of
the steps, whatever fails when.

This relies on one property of every writer (local and remote alike): a writer call
(``append_batch``, ``create_items``, ``end_episode``) that raises
:class:`~rlreplay.errors.ReplayTimeoutError` took nothing of its input, and one that
returns took all of it; ``end_episode`` twice in a row is ``end_episode`` once.
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
        jobs: ``(table, span, starts, extents)`` per table: items to create after the
            rows, ``starts`` relative to the chunk's last row (``-1`` is that row).
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

    While a chunk is pending, later chunks queue behind it (detached from the adder's
    buffers) and the writer is not called again in the same adder call: one call waits
    at most one ``timeout``. :meth:`drain` retries the pending chunks (at the start of
    the next call), :meth:`raise_failure` re-raises the timeout at the end of the call
    that met it.

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
        """Hand the pending chunks over, oldest first, until one times out again (the
        start of an adder call: a failure left by a call that raised otherwise is reset)."""
        self.failure = None
        while self.pending:
            try:
                self._run(self.pending[0], timeout)
            except ReplayTimeoutError as exc:
                self.failure = exc
                return
            self.pending.popleft()

    def raise_failure(self) -> None:
        """Re-raise the timeout met during this call, if any (the call's step is kept).

        Raises:
            ReplayTimeoutError: the writer's own error type, its message extended by what
                the adder kept.
        """
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
        """Do what is left of ``chunk``; its progress is recorded as each part succeeds."""
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
    consecutive packs of half that many
    (:func:`~rlreplay.core.rate_limiters.insert_pack`), pieces split where a pack ends: a
    call beyond the window would be refused (``DeadlockError``) or wait for samples that
    could never come, and one of the whole window would wait until the sampler drained
    the limiter. The items and their order are the same either way.

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


DEFAULT_EVERY = 16


def check_every(every: Any, batched: bool) -> int:
    """The ``hand_over_every`` an adder stages pieces for: ``every`` checked, or the
    default (:data:`DEFAULT_EVERY` with a batch axis, 1 without one: a single
    environment's episodes go over as they end).

    Raises:
        InvalidArgumentError: for anything but ``None`` or an int >= 1.
    """
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
        chunk_length: the adder's ``chunk_length`` (items of one ``create_items`` call
            for a rate-limited table, see :class:`ChunkBatch`).
        every: adder calls a staged piece may wait (see the module docstring).
        rows_per_call: rows one call may complete (the adder's ``num_envs``); staged
            rows past ``every * rows_per_call`` are handed over at once.
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
        # The adder's calls recorded but not settled yet (an n-step adder's NStepBlock, or
        # None): they may have cut pieces, settled before the stage is counted or handed over.
        self.deferred: Any = None
        # (env, first episode row kept) to drop from the adder's buffers once the call's
        # pieces are staged
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
        """Drop the rows the adder no longer needs from its buffers (``rows``, its
        :class:`~rlreplay.writers.episode_steps.EpisodeRows`): staged pieces hold copies."""
        for i, row in self.drops:
            rows.keep_from(i, row)
        self.drops.clear()

    def end_call(self, force: bool) -> None:
        """End an adder call: hand the staged pieces over if ``force``, or if they have
        waited ``every`` calls or fill the stage. A writer timeout is kept for
        :meth:`ChunkWriter.raise_failure`. Recorded calls count as staged pieces; they
        are settled before a hand-over."""
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
