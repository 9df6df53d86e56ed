"""Cutting an adder's episode rows into pieces: complete rows and the items over them.

A *piece* is what one environment hands over at once: its episode rows that became
complete since its last piece (every stored field known: an n-step return needs ``n``
rewards), the adder's computed columns for them, and the items they allow, per table. A
piece is cut when an episode ends or when an open episode holds ``chunk_length``
complete rows; it goes to the :class:`~rlreplay.writers.hand_over.HandOver`, which stages
its rows and hands it to the writer later.

Pieces of different environments interleave in the store and an item must be contiguous
there, so a piece that does not continue the previous piece's stream (environment and
episode) starts with the last ``span - 1`` rows of its episode again (``copied_rows``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.writers.hand_over import HandOver


class EpisodePieces:
    """Cuts the episode rows of an adder (a :class:`~rlreplay.writers.stream.StreamAdder`)
    into pieces and stages them with ``out``.

    The adder owns the episodes' state (``_active``, ``_steps``, ``_serial``, its rows
    ``_rows``) and computes columns and items (``_computed``, ``_items``, its sequence
    rules); this object reads them and records how far each episode was handed over
    (the adder's ``_appended``), the stream of the last piece and the row counters.

    Args:
        adder: the adder whose rows are cut.
        out: where pieces go.
    """

    def __init__(self, adder: Any, out: HandOver):
        self.adder = adder
        self.out = out
        self.last_stream: tuple[int, int] | None = None  # stream of the last piece
        self.copied_rows = 0
        self.appended_rows = 0
        # A lower bound on the calls of flush_ready before an open episode can hold a
        # chunk of complete rows (its steps past what was appended grow by at most one
        # between calls, and only shrink otherwise).
        self._countdown = 0

    def flush_ready(self) -> None:
        """Cut a piece for every open episode holding a chunk of complete rows."""
        a = self.adder
        if a.pad < a.chunk_length:
            self._countdown -= 1
            if self._countdown > 0:
                return
            # ready - appended >= chunk_length with ready = pad + max(0, steps - lag + 1):
            # before lag - 1 steps only padding rows are ready, fewer than a chunk.
            gap = a.chunk_length + a.lag - 1 - a.pad
            behind = np.where(a._active, a._steps - a._appended, 0)
            full = behind >= gap
            self._countdown = 1 if full.any() else gap - int(behind.max())
        else:
            ready = a.pad + np.maximum(0, a._steps - a.lag + 1)
            full = a._active & (ready - a._appended >= a.chunk_length)
        if full.any():
            for i in np.flatnonzero(full).tolist():
                self.cut(i, ended=False, terminated=False)

    def started(self) -> None:
        """Episodes started: a new episode's padding rows count as complete, so it may
        hold a chunk sooner than the countdown assumed; recount at the next call."""
        self._countdown = 0

    def end(self, idx: np.ndarray, terminated: np.ndarray) -> None:
        """Cut the last piece of the episodes of environments ``idx`` (``terminated[k]``
        for ``idx[k]``); their rows are then staged and the adder's buffers free."""
        for i, term in zip(idx.tolist(), terminated.tolist()):
            self.cut(i, ended=True, terminated=bool(term))

    def cut(self, i: int, ended: bool, terminated: bool) -> None:
        """Cut env ``i``'s piece: its rows complete since the last one (all of them when
        the episode ``ended``) and the items they allow."""
        a = self.adder
        lo = int(a._appended[i])
        steps = int(a._steps[i])
        hi = a.pad + (steps + 1 if ended else max(0, steps - a.lag + 1))  # complete rows
        stream = (i, int(a._serial[i]))
        rows, switch = 0, False
        if hi > lo:
            first = lo
            if self.last_stream != stream:
                first = max(0, lo - (a.span - 1))
                switch = True
                self.copied_rows += lo - first
            rows = hi - first
            out = self.out.reserve(rows)  # the rows go straight to the staging buffer
            a._rows.copy_rows(i, first, hi, out)
            a._computed(i, first, hi, ended, terminated, out)
            self.last_stream = stream
            self.appended_rows += rows
            a._appended[i] = hi
        jobs = []
        anchors, extents = a._items(i, hi, ended, terminated)
        if len(anchors):
            starts = anchors - hi  # one array for every table (nobody writes to it)
            jobs += [(t, span, starts, extents) for t, span in zip(a.tables, a._spans)]
        for (table, rule), span in zip(a._sequences, a._sequence_spans):
            starts, lengths = rule.items(i, hi, a.pad, steps, ended)
            if len(starts):
                jobs.append((table, span, starts - hi, lengths))
        if rows or jobs:
            self.out.stage(rows, switch, jobs)
        if not ended:
            self.out.drops.append((i, max(0, hi - (a.span - 1))))
