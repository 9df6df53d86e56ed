"""When an adder's completed rows and items go to its writer: staged, then in bulk.

An adder completes *pieces* (one environment's episode rows and the items over them, see
:class:`~rlreplay.writers.chunk_batch.ChunkBatch`) as episodes end or chunks fill. A
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
complete ``n - 1`` steps after it was taken and an open episode is cut once it holds
``chunk_length`` complete rows, so without flushes an item waits at most
``chunk_length + n - 1 + every - 1`` steps. With ``every=1`` each call hands over what
it completed.

What the writer could not take (a timeout) stays pending in order, as
:class:`~rlreplay.writers.chunk_writer.ChunkWriter` describes; staging changes only when
the writer is called, never what it receives: the store holds the same rows and items,
in the same order per table, as with ``every=1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.writers.chunk_batch import ChunkBatch
from rlreplay.writers.chunk_writer import ChunkWriter

# Adder calls a batched adder stages pieces for by default; a writer call's fixed cost is
# then shared by about ``16 * num_envs`` rows (see the module docstring).
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
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise InvalidArgumentError(
            f"hand_over_every={describe(every)} must be an int >= 1 (adder calls that stage "
            "completed rows before handing them to the writer), or None for the default"
        )
    return every


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
        writer: Any,
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
        :class:`~rlreplay.writers.episode_rows.EpisodeRows`): staged pieces hold copies."""
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
