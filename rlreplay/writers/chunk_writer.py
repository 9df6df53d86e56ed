"""Handing an adder's rows and items to its writer, in order, across writer timeouts.

An adder records each step in its own buffers (which cannot fail once the step's values
are checked) and hands completed rows and the items over them to the writer in *chunks*.
The writer may time out (a full queue table, a rate limiter, a server that does not
answer). A chunk the writer timed out on stays pending with what it already did
recorded (rows appended, tables whose items exist, items created one by one), and so do
the chunks staged after it; the next adder call hands them over first. So nothing is
written twice, nothing is lost, and the order of appends and items is the order of
the steps, whatever fails when.

This relies on one property of every writer (local and remote alike): a writer call
(``append_batch``, ``create_items``, ``create_item``, ``end_episode``) that raises
:class:`~rlreplay.errors.ReplayTimeoutError` took nothing of its input, and one that
returns took all of it; ``end_episode`` twice in a row is ``end_episode`` once.

How staged pieces are joined into chunks is :mod:`rlreplay.writers.chunk_batch`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from rlreplay.core.specs import unflatten
from rlreplay.errors import ReplayTimeoutError

# Items to create over a chunk's rows in one table: ``(table, span, starts, extents)``.
Job = tuple[Any, int, np.ndarray, np.ndarray]


class Chunk:
    """The writer work of one flush of one environment's episode rows.

    Args:
        rows: flat path to ``[k, ...]`` rows to append (``None``: nothing to append).
        switch: end the writer's episode first (the rows continue another stream).
        jobs: ``(table, span, starts, extents)`` per table: items to create after the
            rows, ``starts`` relative to the chunk's last row (``-1`` is that row).
    """

    __slots__ = ("appended", "items_done", "jobs", "jobs_done", "owned", "rows", "switch")

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
        self.items_done = 0  # items of the current job created one by one

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

    def __init__(self, writer: Any, priority: float | None, timeout: float | None):
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
            batch = getattr(writer, "create_items", None)
            if batch is not None:
                full = bool((extents == span).all())
                lengths = None if full else extents
                batch(table, self.priority, starts=starts, lengths=lengths, timeout=timeout)
                self.items_created += len(starts)
            else:
                for k in range(chunk.items_done, len(starts)):
                    extent = int(extents[k])
                    writer.create_item(
                        table,
                        self.priority,
                        start=int(starts[k]),
                        length=None if extent == span else extent,
                        timeout=timeout,
                    )
                    chunk.items_done = k + 1
                    self.items_created += 1
            chunk.jobs_done += 1
            chunk.items_done = 0
