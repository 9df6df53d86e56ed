"""Shared machinery of the adders: one episode stream per environment over one writer.

Each environment's episode becomes *episode rows* (optional frame-stack padding rows, one
row per step, a final row with the last observation) appended through a
:class:`~rlreplay.runtime.interfaces.Writer` in pieces (:mod:`rlreplay.writers.hand_over`);
items never span two episodes. See docs/adders.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.core.table import Table
from rlreplay.errors import ClosedError, InvalidArgumentError, check_timeout, describe
from rlreplay.writers.adder_options import (
    AdderOptions,
    adder_tables,
    adder_writer,
    sequence_rules,
    table_span,
    writer_signature,
    writer_store,
)
from rlreplay.writers.episode_steps import EpisodePieces, EpisodeRows, EpisodeSteps
from rlreplay.writers.hand_over import HandOver
from rlreplay.writers.sequence_items import SequenceItems
from rlreplay.writers.step_inputs import StepInputs


class StreamAdder:
    """Base class of the adders: per-environment episode rows appended through a writer.

    Subclasses set ``span`` (longest item in rows), ``lag`` (a step's row is complete
    ``lag - 1`` steps later) and ``pad`` (padding rows), and implement :meth:`_computed` and
    :meth:`_items`.

    Args:
        writer: a :class:`TrajectoryWriter`-like writer, a :class:`Table`, or tables (a
            ``TrajectoryWriter`` is created over them).
        tables: tables (or names) to create items in; default every table of the writer.
        num_envs: environments per call (``None``: one environment, no batch axis).
        autoreset_mode: ``"next_step"`` or ``"same_step"`` (or gymnasium's enum).
        priority: priority of new items (``None``: each table's default).
        chunk_length: rows buffered per environment before appending (default 64, less for a
            small store).
        timeout: seconds each writer call may wait; a timed-out call keeps its step.
        hand_over_every: adder calls completed rows are staged for (default 16 with a batch
            axis, 1 without); ``flush``, ``end_episode``, ``reset``, ``close`` hand over all.
        sequence_tables: more tables (or names) for sequence items over the same rows, each
            with its :class:`SequenceItems` rule.

    Raises:
        InvalidArgumentError: for bad arguments or a writer whose ``history`` is too short.
    """

    span: int = 1
    lag: int = 1
    pad: int = 0
    computed: tuple[str, ...] = ()

    def __init__(
        self,
        writer: Any,
        *,
        tables: Sequence[Table | str] | None = None,
        num_envs: int | None = None,
        autoreset_mode: Any = "next_step",
        priority: float | None = None,
        chunk_length: int | None = None,
        timeout: float | None = None,
        sequence_tables: Mapping[Table | str, SequenceItems] | None = None,
        hand_over_every: int | None = None,
    ):
        self._sequences = sequence_rules(sequence_tables)
        for _, rule in self._sequences:
            self.span = max(self.span, self.pad + rule.span)
        store = writer_store(writer)
        options = AdderOptions.check(
            fixed=self.span - 1 + self.lag + self.pad + 2,
            store_capacity=None if store is None else store.capacity,
            num_envs=num_envs,
            autoreset_mode=autoreset_mode,
            priority=priority,
            chunk_length=chunk_length,
            timeout=timeout,
            hand_over_every=hand_over_every,
        )
        self.batched = options.batched
        self.num_envs = options.num_envs
        self.mode = options.mode
        self.chunk_length = chunk_length = options.chunk_length
        self.priority = priority
        self.timeout = timeout = options.timeout
        self.capacity = options.capacity
        every = options.every
        self._inputs = StepInputs(
            writer_signature(writer),
            self.computed,
            self.num_envs,
            self.batched,
            bool(getattr(self, "stacked_obs", False)),
        )
        # A writer the adder creates keeps the staged rows, so they go over as one chunk.
        staged = self.capacity + every * self.num_envs + self.capacity
        writer = adder_writer(writer, self.capacity, staged)
        self.writer = writer
        self.tables = adder_tables(writer, tables, [t for t, _ in self._sequences])
        for _, rule in self._sequences:
            rule.bind(self.num_envs)
        n = self.num_envs
        self._rows = EpisodeRows(self._inputs.signature, self._inputs.paths, n, self.capacity)
        self._out = HandOver(
            writer,
            priority,
            timeout,
            reach=max(self.capacity, writer.history),
            chunk_length=chunk_length,
            every=every,
            rows_per_call=self.num_envs,
            fields={p: (s.shape, s.dtype) for p, s in self._inputs.signature.fields.items()},
        )
        self._chunks = self._out.chunks
        self._episodes = EpisodeSteps(
            n, self.mode, self.pad, chunk_length, self._inputs, self._rows, self._out, timeout
        )
        self._pieces = self._episodes.pieces = EpisodePieces(
            self._episodes,
            (self.pad, self.lag, self.span, chunk_length),
            self._computed,
            self._items,
            [(t, table_span(writer, t)) for t in self.tables],
            [(t, rule, table_span(writer, t)) for t, rule in self._sequences],
        )
        # A subclass's NStepBlock settling calls a block at a time, or None (per call).
        self._block: Any = None
        self._closed = False  # by close(): every later call raises ClosedError

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise ClosedError(
                f"{call}() after close(): the adder no longer writes (its steps would be "
                "lost); create a new adder"
            )

    @property
    def _steps(self) -> np.ndarray:
        """Steps of each environment's current episode (recorded calls settled)."""
        self._settle()
        return self._episodes.steps

    def _settle(self) -> None:
        """Settle the calls recorded in the current block."""
        if self._block is not None:
            self._block.sync()

    @property
    def episodes(self) -> int:
        """Episodes ended so far."""
        self._settle()
        return self._episodes.episodes

    @property
    def appended_rows(self) -> int:
        """Rows handed to the writer (staged and context rows included)."""
        self._settle()
        return self._pieces.appended_rows

    @property
    def copied_rows(self) -> int:
        """Context rows appended again before a piece that continues an episode."""
        self._settle()
        return self._pieces.copied_rows

    @property
    def items_created(self) -> int:
        """Items the writer has created for this adder."""
        return self._chunks.items_created

    @property
    def pending_chunks(self) -> int:
        """Chunks kept after a writer timeout, handed over first by the next call."""
        return len(self._chunks.pending)

    @property
    def staged_rows(self) -> int:
        """Completed rows staged for the writer."""
        self._settle()
        return self._out.staged_rows

    def reset(self, obs: Any, env_ids: Any = None) -> None:
        """Start new episodes at their first observations; an open episode ends first, truncated.

        Args:
            obs: first observations, ``[num_envs, ...]`` (or ``[len(env_ids), ...]``).
            env_ids: which environments reset (default: all).

        Raises:
            InvalidArgumentError: for unfitting observations or bad ``env_ids`` (nothing changes).
            ReplayTimeoutError: if the writer timed out; the step is kept (retry: ``hand_over()``).
        """
        self._check_open("reset")
        idx = self._inputs.env_ids(env_ids)
        first = self._inputs.observations(obs, len(idx), "reset()")
        self._settle()
        self._chunks.drain(self.timeout)
        episodes = self._episodes
        open_ = idx[episodes.active[idx]]
        if len(open_):
            episodes.finish(open_, np.zeros(len(open_), dtype=bool))
            self._out.release(self._rows)
        episodes.start(idx, first)
        episodes.count_stepping()
        self._out.end_call(force=True)
        self._chunks.raise_failure()

    def add(
        self,
        action: Any,
        reward: Any,
        next_obs: Any,
        terminated: Any,
        truncated: Any,
        info: Mapping[str, Any] | None = None,
        extras: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one environment step (of every environment), as ``env.step`` returned it.

        Every argument is checked first: a rejected call leaves the adder as it was.

        Args:
            action: the actions taken, ``[num_envs, ...]``.
            reward: rewards received, ``[num_envs]``.
            next_obs: observations returned by the step.
            terminated: episode ended in a terminal state (no bootstrapping).
            truncated: episode cut by a time limit (bootstrap from the final observation).
            info: the step's info (``final_obs`` is read in ``"same_step"`` mode, refused in
                ``"next_step"`` mode).
            extras: the signature's other per-step fields, each ``[num_envs, ...]``.

        Raises:
            SignatureError: for a missing or unknown field, a wrong shape or an unfitting value.
            InvalidArgumentError: for bad flags or ``info``, a step before :meth:`reset`, or an
                env in the other autoreset mode.
            ReplayTimeoutError: if the writer timed out; the step is kept (retry: ``hand_over()``).
        """
        self._check_open("add")
        fields, obs = self._inputs.step(action, reward, next_obs, extras)
        term = self._inputs.flags(terminated, "terminated")
        trunc = self._inputs.flags(truncated, "truncated")
        block = self._block
        if block is None or not block.record(fields, obs, term, trunc, info):
            self._settle()
            self._episodes.record(fields, obs, term, trunc, info)
        self._out.end_call(force=False)
        self._chunks.raise_failure()

    def end_episode(self, terminated: bool = False, env_ids: Any = None) -> None:
        """End open episodes now (``terminated=False``: items bootstrap from the last observation).

        Raises:
            InvalidArgumentError: for a non-bool ``terminated`` or bad ``env_ids``.
            ReplayTimeoutError: if the writer timed out; the step is kept (retry: ``hand_over()``).
        """
        self._check_open("end_episode")
        if not isinstance(terminated, (bool, np.bool_)):
            raise InvalidArgumentError(
                f"terminated={describe(terminated)} must be a bool (True: no bootstrapping)"
            )
        idx = self._inputs.env_ids(env_ids)
        self._settle()
        self._chunks.drain(self.timeout)
        idx = idx[self._episodes.active[idx]]
        if len(idx):
            self._episodes.finish(idx, np.full(len(idx), bool(terminated)))
            self._out.release(self._rows)
            self._episodes.count_stepping()
        self._out.end_call(force=True)
        self._chunks.raise_failure()

    def hand_over(self, timeout: float | None = None) -> None:
        """Retry handing over the chunks kept after a writer timeout.

        Waits only for the room the writer needs, not until everything is stored as
        :meth:`flush` does; what an actor calls after :meth:`add` timed out.

        Raises:
            InvalidArgumentError: for a ``timeout`` that is not ``None`` or seconds > 0.
            ReplayTimeoutError: if the writer timed out again (the chunks stay kept).
        """
        self._check_open("hand_over")
        timeout = check_timeout(timeout)
        self._chunks.drain(self.timeout if timeout is None else timeout)
        self._chunks.raise_failure()

    def flush(self, timeout: float | None = None) -> None:
        """Append every complete buffered row, create the items it allows, then flush the writer.

        Rows not complete yet (an open n-step return, an open episode's last rows, whose discount
        ``end_episode(terminated=True)`` may still change) stay buffered.

        Raises:
            InvalidArgumentError: for a ``timeout`` that is not ``None`` or seconds > 0.
            ReplayTimeoutError: if the writer timed out (the rest stays pending).
        """
        self._check_open("flush")
        timeout = check_timeout(timeout)
        self._settle()
        self._chunks.drain(self.timeout if timeout is None else timeout)
        for i in np.flatnonzero(self._episodes.active):
            self._pieces.cut(int(i), ended=False, terminated=False)
        self._out.release(self._rows)
        self._out.end_call(force=True)
        self._chunks.raise_failure()
        self.writer.flush(self.timeout if timeout is None else timeout)

    def close(self) -> None:
        """End every open episode as truncated, flush and close the writer.

        An exception leaving a ``with`` block drops what is staged or pending instead.

        Raises:
            ReplayTimeoutError: if the writer timed out; it stays open, call ``close()`` again.
        """
        if self._closed:
            return
        self.end_episode(terminated=False)
        self.writer.flush(self.timeout)
        self.writer.close()
        self._closed = True

    def __enter__(self) -> StreamAdder:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        # Hand nothing more over: a refusing table would hold the exception back.
        self._closed = True
        self.writer.__exit__(exc_type, *exc)

    def _computed(
        self, i: int, lo: int, hi: int, ended: bool, terminated: bool, out: dict[str, np.ndarray]
    ) -> None:
        """Write the adder's computed columns for episode rows ``[lo, hi)`` into ``out``."""

    def _items(
        self, i: int, appended: int, ended: bool, terminated: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Anchor rows and extents of env ``i``'s items now creatable; records them."""
        raise NotImplementedError
