"""Shared machinery of the adders: one episode stream per environment over one writer.

An adder receives environment steps, one environment or a batch of ``num_envs`` of them
(gymnasium ``VectorEnv`` shapes), and turns each environment's episodes into *episode
rows* that it appends through a :class:`~rlreplay.runtime.interfaces.Writer`
(``append_batch``, ``create_items(table, priorities, starts=, lengths=)``,
``end_episode``, ``flush``, ``close``, ``__exit__``, and the step ``signature``,
``history`` and ``tables``). Episode rows
of one episode are, in order:

* ``stack - 1`` padding rows whose observation repeats the episode's first observation
  (only with frame stacking, see :class:`NStepTransitionAdder`);
* one row per step ``t``: ``obs_t``, the action taken, the reward received and extras;
* one final row holding the last observation (the true final observation, also after a
  truncation) with zero action, reward and extras.

Rows are held per environment (:class:`~rlreplay.writers.episode_steps.EpisodeRows`, one
write per field per call, vectorised over environments) and completed in pieces of about
``chunk_length`` rows: a row is complete once no later call can change it, every stored
field of it known and the episode gone on past them (an n-step return needs ``n``
rewards, and ``end_episode(terminated=True)`` right after them would end it without
bootstrapping). Completed pieces are staged and handed to the writer
in bulk every ``hand_over_every`` calls (:mod:`rlreplay.writers.hand_over`; joined by
:class:`~rlreplay.writers.hand_over.ChunkBatch`, kept across writer timeouts by
:class:`~rlreplay.writers.hand_over.ChunkWriter`). Items never span two episodes.

Pieces of different environments interleave in the store, so a piece that does not
continue its environment's previous one repeats the last ``span - 1`` rows of its episode
(``copied_rows``: an overhead of ``(span - 1) / chunk_length`` with several environments;
see :mod:`rlreplay.writers.episode_steps` and docs/adders.md). What a checked step does to each
environment's episode is :class:`~rlreplay.writers.episode_steps.EpisodeSteps`' part.

Autoreset modes: see :mod:`rlreplay.writers.autoreset`. The adder's options are checked
(:class:`~rlreplay.writers.adder_options.AdderOptions`) before any part is built, and
every call's arguments (:class:`~rlreplay.writers.step_inputs.StepInputs`) before
anything changes.

An adder may record its calls and settle them a block at a time instead (the n-step
adder's :class:`~rlreplay.writers.nstep_blocks.NStepBlock`): what reaches the writer is
the same.
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
    ``lag - 1`` steps after it was taken), ``pad`` (padding rows at episode start) and
    implement :meth:`_computed` and :meth:`_items`.

    Args:
        writer: a writer with the :class:`TrajectoryWriter` interface, a :class:`Table`,
            or a list of tables (a ``TrajectoryWriter`` is then created over them).
        tables: tables (or names) to create items in; default every table of the writer.
        num_envs: environments per call (``None``: one environment, inputs without a
            batch axis).
        autoreset_mode: ``"next_step"`` or ``"same_step"`` (or gymnasium's enum).
        priority: priority of new items (``None``: each table's default).
        chunk_length: rows buffered per environment before they are appended (default
            64, less when the store is small). Larger chunks mean fewer re-appended
            context rows with several environments, and items that appear later.
        timeout: seconds each writer call may wait for rate limiters and queues. A call
            that times out keeps its step: what the writer could not take yet is handed
            over first by the next call (see :class:`ChunkWriter`); do not repeat it.
        hand_over_every: adder calls completed rows are staged for before they go to
            the writer in one go (default 16 with a batch axis, 1 without): items reach
            their tables at most ``hand_over_every - 1`` calls after their rows are
            complete, and at every ``flush``, ``end_episode``, ``reset`` and ``close``
            (see :mod:`rlreplay.writers.hand_over`).
        sequence_tables: more tables (or names) to fill with sequence items over the same
            rows, each with its :class:`SequenceItems` rule (e.g. a FIFO queue of
            sequences next to a prioritized table of n-step transitions).

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
        # A writer the adder creates keeps the rows of what it stages, when the store
        # is large enough (so that the staged pieces go over as one chunk).
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
        # What records the calls and settles them a block at a time, or None: every call
        # goes through EpisodeSteps at once. An object with ``calls``, ``record(fields,
        # obs, term, trunc, info) -> bool``, ``settle()`` and ``sync()`` (which also brings
        # the episode rows up to date), set by a subclass as its hand-over's ``deferred``
        # (see :class:`~rlreplay.writers.nstep_blocks.NStepBlock`).
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
        """Do what the calls recorded in the current block do (see ``_block``)."""
        if self._block is not None:
            self._block.sync()

    @property
    def episodes(self) -> int:
        """Episodes ended so far."""
        self._settle()
        return self._episodes.episodes

    @property
    def appended_rows(self) -> int:
        """Rows handed to the writer (staged included), context rows included."""
        self._settle()
        return self._pieces.appended_rows

    @property
    def copied_rows(self) -> int:
        """Context rows appended again before a piece that continues an episode after
        another stream's rows (see :mod:`rlreplay.writers.episode_steps`)."""
        self._settle()
        return self._pieces.copied_rows

    @property
    def items_created(self) -> int:
        """Items the writer has created for this adder."""
        return self._chunks.items_created

    @property
    def pending_chunks(self) -> int:
        """Chunks of rows and items kept after a writer timeout, handed over first by
        the next call (0 when the writer has taken everything)."""
        return len(self._chunks.pending)

    @property
    def staged_rows(self) -> int:
        """Completed rows staged for the writer (handed over within ``hand_over_every``
        calls, or by :meth:`flush`)."""
        self._settle()
        return self._out.staged_rows

    # --------------------------------------------------------------- episodes
    def reset(self, obs: Any, env_ids: Any = None) -> None:
        """Start new episodes with their first observations (what ``env.reset`` returned).

        An environment whose episode is still open has it ended first as truncated,
        bootstrapping from its last observation.

        Args:
            obs: first observations, ``[num_envs, ...]`` (or ``[len(env_ids), ...]``;
                without the batch axis when ``num_envs=None``).
            env_ids: which environments reset (default: all).

        Raises:
            InvalidArgumentError: for observations that do not fit the signature or bad
                ``env_ids``; the adder is then unchanged.
            ReplayTimeoutError: if the writer timed out; the call's step is kept and
                what the writer did not take stays pending for the next call.
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

        Every argument is checked against the store's signature (the rules a table
        applies) before anything changes: a rejected call leaves the adder as it was, and
        the next calls produce exactly the items they would have produced without it.

        Args:
            action: the actions taken, ``[num_envs, ...]``.
            reward: rewards received, ``[num_envs]``.
            next_obs: observations returned by the step.
            terminated: episode ended in a terminal state (no bootstrapping).
            truncated: episode cut by a time limit (bootstrap from the final observation).
            info: the step's info dict; ``"same_step"`` mode reads ``final_obs`` from it,
                ``"next_step"`` mode refuses it when it carries ``final_obs`` (the env
                autoresets in the same step).
            extras: the signature's other per-step fields (e.g. policy logits), each
                ``[num_envs, ...]``; required when the signature has any.

        Raises:
            SignatureError: for a missing or unknown field, a wrong shape, or a value that
                does not fit its column (e.g. a float action for an int column).
            InvalidArgumentError: for bad ``terminated``/``truncated``/``info``, a step
                before :meth:`reset`, or an env whose autoreset mode is not the adder's.
            ReplayTimeoutError: if the writer timed out; the call's step is kept and
                what the writer did not take stays pending for the next call.
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
        """End open episodes now (e.g. a time limit the environment does not report).

        The last observation given becomes the final one; with ``terminated=False`` items
        bootstrap from it.

        Raises:
            InvalidArgumentError: for a ``terminated`` that is not a bool or bad
                ``env_ids``; the adder is then unchanged.
            ReplayTimeoutError: if the writer timed out; the call's step is kept and
                what the writer did not take stays pending for the next call.
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
        """Hand the chunks kept after a writer timeout to the writer again, waiting only
        for the room it needs to take them (a remote writer: for fewer chunks in flight),
        not, as :meth:`flush` does, until everything is stored. What an actor retries
        after :meth:`add` timed out: it acts on as soon as the table takes its step.

        Raises:
            InvalidArgumentError: for a ``timeout`` that is not ``None`` or seconds > 0.
            ReplayTimeoutError: if the writer timed out again (the chunks stay kept).
        """
        self._check_open("hand_over")
        timeout = check_timeout(timeout)
        self._chunks.drain(self.timeout if timeout is None else timeout)
        self._chunks.raise_failure()

    def flush(self, timeout: float | None = None) -> None:
        """Append every complete buffered row and create the items it allows, then flush
        the writer. Rows not complete yet stay buffered: those whose fields are not known
        (an n-step return) and the last ones of an open episode, whose discount
        ``end_episode(terminated=True)`` may still change.

        Raises:
            InvalidArgumentError: for a ``timeout`` that is not ``None`` or seconds > 0.
            ReplayTimeoutError: if the writer timed out (what it did not take stays
                pending for the next call).
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

        Raises:
            ReplayTimeoutError: if the writer timed out; the writer stays open and the
                rest stays pending, so ``close()`` may be called again. (Leaving a
                ``with`` block because of an exception hands nothing more over and waits
                for nothing: what is still staged or pending is dropped.)
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
        # An exception is leaving the block: hand nothing more over (a table that refuses
        # it would hold the exception back for the whole timeout, or for ever); the writer
        # drops what it still holds.
        self._closed = True
        self.writer.__exit__(exc_type, *exc)

    # ------------------------------------------------------------ subclasses
    def _computed(
        self, i: int, lo: int, hi: int, ended: bool, terminated: bool, out: dict[str, np.ndarray]
    ) -> None:
        """Write the stored columns the adder computes for episode rows ``[lo, hi)`` into
        ``out`` (path to ``[hi - lo, ...]`` views of the staging buffer)."""

    def _items(
        self, i: int, appended: int, ended: bool, terminated: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Anchor rows and extents (int64 arrays) of the items now creatable for env ``i``;
        the subclass records them as created."""
        raise NotImplementedError
