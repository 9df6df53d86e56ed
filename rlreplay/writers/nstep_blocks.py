"""An n-step adder's calls recorded in blocks and cut into pieces a block at a time.

Per call, :class:`~rlreplay.writers.episode_steps.EpisodeSteps` writes each step into
every environment's episode rows and cuts a piece whenever an episode ends (its rows
copied, its returns, discounts and items computed): a dozen numpy calls per call and
about as many per ended episode. With many environments and short episodes (a random
CartPole policy ends an episode in most calls of 16 environments), that per-episode
work costs more than the call itself.

:class:`NStepBlock` keeps an adder call to checking its step and copying it into
preallocated block arrays (``[every, num_envs, ...]`` per field: one contiguous copy per
field, no per-environment or per-episode work). Every ``hand_over_every`` calls (or
before anything else reads or changes the adder's episodes: ``reset``, ``end_episode``,
``flush``, a call where some environments do not step) :meth:`NStepBlock.settle` does in
one pass what those calls would have done, whatever the number of episodes that ended:

* a small compiled plan (``rlreplay/writers/_blocks.c``) replays the calls' bookkeeping
  environment by environment, as the per-call path does it but without touching a row:
  which episodes ended (in ``next_step`` mode the step after an end is ignored and
  starts the next one), where each step's row goes in per-environment scratch rows (rows
  still held from before the block first), every piece the per-call path cuts (by call,
  ended episodes before full chunks, by environment) with its context rows, discounts,
  reward windows and items, and the episodes' state after the block;
* the rows move with one copy per field (``copy_rows``), the n-step returns are one
  matrix product over the reward windows, and the block's pieces go to the chunk batch
  as one entry.

The writer receives exactly what the per-call path gives it: same rows, same items in
the same order per table, same counters (a property test compares the two over random
episode ends, truncations, autoreset modes and calls that settle early). Without the
compiled plan (no compiler, or ``RLREPLAY_NO_EXTENSION=1``) there are no blocks: every
call takes the per-call path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core._compiled import load_kernel
from rlreplay.writers.autoreset import final_obs_source
from rlreplay.writers.episode_steps import EpisodeSteps

# The compiled plan of a block (rlreplay/writers/_blocks.c), or None: no blocks.
_kernel = load_kernel("rlreplay.writers._blocks")
COMPILED = _kernel is not None


class NStepBlock:
    """Records the calls of a batched :class:`~rlreplay.writers.nstep.NStepTransitionAdder`
    (without sequence tables, with fewer padding rows than ``chunk_length``) and settles
    them a block at a time (see the module docstring).

    Args:
        adder: the adder (its sizes and tables).
        every: calls per block (the adder's ``hand_over_every``).
        episodes: the adder's episodes; they, their rows, pieces and hand-over are
            updated on :meth:`settle`.
        next_item: the adder's next item anchor per environment (updated in place).
        powers: the adder's discount powers ``discount ** [0 .. n]``.
        tail: the discount of an ended episode's row by the steps it leaves.
    """

    def __init__(
        self,
        adder: Any,
        every: int,
        episodes: EpisodeSteps,
        next_item: np.ndarray,
        powers: np.ndarray,
        tail: np.ndarray,
    ):
        self.adder = adder
        self.episodes = episodes
        self.episode_rows = episodes.rows
        self.pieces = episodes.pieces
        self.out = episodes.out
        self.next_item = next_item
        self.powers = powers
        self.weights = powers[: adder.n]  # of a return's n rewards
        self.tail = tail
        self.size = every
        self.calls = 0  # calls recorded since the last settle
        # Rows those calls wrote (a step per environment, a final and padding rows per
        # ended episode): once they reach what the hand-over takes in one go
        # (``every * num_envs``), the block is settled and counted early.
        self.rows = 0
        self.max_rows = self.out.max_rows
        a = adder
        inputs = episodes.inputs
        sig = inputs.signature
        k, e = every, a.num_envs
        self.same_step = a.mode == "same_step"
        self.obs_paths = tuple(inputs.obs_paths)
        self.field_paths = tuple(p for p in inputs.paths if p not in self.obs_paths)

        def block(p: str) -> np.ndarray:
            return np.zeros((k, e, *sig[p].shape), dtype=sig[p].dtype)

        self.fields = {p: block(p) for p in self.field_paths}
        self.obs = {p: block(p) for p in self.obs_paths}  # the observation after each step
        # same-step mode: observations as returned (reset ones for ended episodes)
        self.reset_obs = {p: block(p) for p in self.obs_paths} if self.same_step else {}
        self.terminated = np.zeros((k, e), dtype=bool)
        self.truncated = np.zeros((k, e), dtype=bool)
        self._no_ends = np.zeros(e, dtype=bool)
        self._no_ends.flags.writeable = False
        # Scratch rows per environment: the rows it holds stay there from block to block
        # and each block's rows go after them, until they reach the end (then the held
        # rows move back to the front: about every cap / every blocks).
        cap = self.episode_rows.capacity
        self.width = 3 * cap + 2 * k * (2 + a.pad) + 2
        self.scratch = {
            p: np.zeros((e, self.width, *sig[p].shape), dtype=sig[p].dtype) for p in inputs.paths
        }
        self._flat = {p: s.reshape(e * self.width, *s.shape[2:]) for p, s in self.scratch.items()}
        # The compiled plan's outputs (see _run_plan), sized for the worst block.
        self._plan = _kernel.plan
        self._copy_rows = _kernel.copy_rows
        # The block's rows per field as [every * num_envs, ...] (views): the steps' values
        # (fields, observations after them) and a new episode's first observation.
        self._rows_of = {
            p: b.reshape(k * e, *b.shape[2:]) for p, b in (*self.fields.items(), *self.obs.items())
        }
        first = self.reset_obs if self.same_step else self.obs
        self._first_of = {p: b.reshape(k * e, *b.shape[2:]) for p, b in first.items()}
        most = e * (cap + k * (2 + a.pad + a.span)) + 16
        self._params = np.zeros(14, dtype=np.int64)
        self._plan_out = {
            "steps": np.zeros(2 * k * e, dtype=np.int64),
            "firsts": np.zeros(2 * k * e * (a.pad + 1), dtype=np.int64),
            "rows": np.zeros(most, dtype=np.int64),
            "window": np.zeros(most * a.n, dtype=np.int64),
            "disc": np.zeros(most, dtype=np.float64),
            "pieces": np.zeros(3 * (k + 1) * e, dtype=np.int64),
            "rel": np.zeros(most, dtype=np.int64),
            "ext": np.zeros(most, dtype=np.int64),
            "held": np.zeros(e * (cap + 1), dtype=np.int64),
        }
        self._cap_range = np.arange(cap)
        # Where each env's held rows are in its scratch rows (see _load), when they are
        # there rather than in the episode rows (_in_scratch).
        self._origin = np.zeros(e, dtype=np.int64)
        self._in_scratch = False

    # ---------------------------------------------------------------- record
    def record(
        self,
        fields: dict[str, np.ndarray],
        obs: dict[str, np.ndarray],
        term: np.ndarray,
        trunc: np.ndarray,
        info: Any,
    ) -> bool:
        """Record one checked step of every environment (see :meth:`StreamAdder.add`);
        ``False`` (nothing recorded) when some environment does not step.

        Raises:
            InvalidArgumentError: for final observations that do not fit or an env in
                the other autoreset mode; nothing changes then.
        """
        a = self.adder
        episodes = self.episodes
        if episodes.stepping != a.num_envs:
            return False
        final = obs
        ends = 0
        if self.same_step or not (info is None or (type(info) is dict and not info)):
            # The info dict's final observations: read in same-step mode, refused in
            # next-step mode for an episode that ended (the env is in the other mode).
            # Which episodes end is settled with the block (the step after an end is
            # ignored in next-step mode).
            done = term | trunc
            any_done = bool(done.any())
            source = final_obs_source(a.mode, info, any_done)
            if source is not None:
                idx = np.flatnonzero(done)  # same-step: every done episode ends
                ends = len(idx)
                if ends:
                    final = episodes.inputs.final_observations(obs, source, idx)
        # Everything is checked: the adder changes from here on.
        chunks = self.out.chunks
        if chunks.pending:  # what the writer did not take yet goes first
            chunks.drain(a.timeout)
        else:
            chunks.failure = None
        k = self.calls
        for p, v in fields.items():
            self.fields[p][k] = v
        for p, v in final.items():
            self.obs[p][k] = v
        if final is not obs:
            for p, v in obs.items():
                self.reset_obs[p][k] = v
        self.terminated[k] = term
        self.truncated[k] = trunc
        self.calls = k + 1
        self.rows += a.num_envs + ends * (1 + a.pad)
        if self.calls == self.size or self.rows >= self.max_rows:
            self.settle()
        return True

    # ---------------------------------------------------------------- settle
    def settle(self) -> None:
        """Do what the recorded calls do to the adder's episodes: stage every piece they
        cut, in order, and bring the episodes' state and rows up to date."""
        K = self.calls
        if K == 0:
            return
        self.calls = 0
        self.rows = 0
        self._run_plan(K)

    def sync(self) -> None:
        """Settle, and give the episode rows their held rows back (what the per-call path
        reads and writes): before ``reset``, ``end_episode``, ``flush``, a call in which
        some environments do not step, and reads of the adder's counters."""
        self.settle()
        if self._in_scratch:
            self._write_back()

    def _write_back(self) -> None:
        """Copy each env's held rows from its scratch rows to its episode rows (from
        position 0; stored fields zero past them), as the last plan placed them."""
        rows, o = self.episode_rows, self._plan_out
        cap, e = rows.capacity, self.adder.num_envs
        at = o["held"][: e * cap]
        beyond = self._cap_range >= o["held"][e * cap :, None]
        for p, arr in rows.arrays.items():
            self._copy_rows(arr.reshape(-1, *arr.shape[2:]), None, self._flat[p], at, 0)
            if p in self.fields:
                arr[beyond] = 0
        self._in_scratch = False

    def _load(self) -> None:
        """Put each env's held rows first in its scratch rows (position 0 holds episode
        row ``base``), stored fields zero past them (final and padding rows are never
        written), and make the scratch rows where the next plans find them."""
        a = self.adder
        episodes, rows = self.episodes, self.episode_rows
        held = int((a.pad + episodes.steps - rows.base).max()) + 1
        awaiting = episodes.awaiting_reset
        stale = awaiting.any()  # rows of an ended episode, not to be read again
        for p in self.field_paths:
            scratch = self.scratch[p]
            scratch[:, :held] = rows.arrays[p][:, :held]
            scratch[:, held:] = 0
            if stale:
                scratch[awaiting, :held] = 0
        for p in self.obs_paths:
            self.scratch[p][:, :held] = rows.arrays[p][:, :held]
        self._origin[:] = 0
        self._in_scratch = True

    def _run_plan(self, K: int) -> None:
        """:meth:`settle` with the compiled plan (``rlreplay.writers._blocks``): the
        kernel replays the calls' bookkeeping; numpy moves the rows, one gather or
        scatter per field."""
        a = self.adder
        episodes, rows, pieces = self.episodes, self.episode_rows, self.pieces
        E, W, pad, n = a.num_envs, self.width, a.pad, a.n
        flat = self._flat
        awaiting = episodes.awaiting_reset
        # Held rows stay in the scratch rows from block to block; the block's rows go
        # after them. Where they would not fit, the held rows move back to the front.
        if self._in_scratch:
            end = self._origin + np.where(awaiting, 0, pad + episodes.steps - rows.base + 1)
            if int(end.max()) + K * (2 + pad) + 2 > W:
                self._write_back()
        if not self._in_scratch:
            self._load()
        last = pieces.last_stream
        params = self._params
        params[:] = (
            K,
            E,
            pad,
            n,
            a.lag,
            a.chunk_length,
            a.span,
            a.stack,
            self.same_step,
            W,
            *(last or (0, 0)),
            last is not None,
            rows.capacity,
        )
        o = self._plan_out
        steps, firsts, count, npieces, nitems, copied, ended, last_e, last_s, has_last = self._plan(
            params,
            self.truncated.view(np.uint8),
            self.terminated.view(np.uint8),
            self.powers,
            episodes.steps,
            episodes.appended,
            episodes.serial,
            self.next_item,
            rows.base,
            awaiting.view(np.uint8),
            o["steps"],
            o["firsts"],
            o["rows"],
            o["window"],
            o["disc"],
            o["pieces"],
            o["rel"],
            o["ext"],
            o["held"],
            self._origin,
        )
        # Each step's fields into its row, the observation it led to into the next row.
        copy = self._copy_rows
        half = len(o["steps"]) // 2
        src = None if steps == K * E else o["steps"][:steps]  # None: every call's steps
        dst = o["steps"][half : half + steps]
        for p in self.field_paths:
            copy(flat[p], dst, self._rows_of[p], src, 0)
        for p in self.obs_paths:
            copy(flat[p], dst, self._rows_of[p], src, 1)
        if firsts:  # a new episode's first observation, on its padding rows and first row
            half = len(o["firsts"]) // 2
            src, dst = o["firsts"][:firsts], o["firsts"][half : half + firsts]
            for p in self.obs_paths:
                copy(flat[p], dst, self._first_of[p], src, 0)
        # The pieces' rows, their computed columns and their items, staged at once.
        if count:
            out = self.out.reserve(count)
            pos = o["rows"][:count]
            for p, f in flat.items():
                copy(out[p], None, f, pos, 0)
            # [rows, n] windows of float64 rewards (zero past an episode's end) times
            # discount powers: the per-piece cut's product, rounded to float32 alike
            window = o["window"][: count * n].reshape(count, n)
            out["n_step_return"][:] = flat["reward"][window].astype(np.float64) @ self.weights
            out["discount"][:] = o["disc"][:count]
        if npieces:
            self._stage_pieces(
                o["pieces"][: 3 * npieces].reshape(npieces, 3),
                count,
                o["rel"][:nitems].copy(),
                o["ext"][:nitems].copy(),
            )
        episodes.active[:] = ~awaiting
        episodes.count_stepping()
        episodes.episodes += ended
        pieces.copied_rows += copied
        pieces.appended_rows += count
        pieces.last_stream = (last_e, last_s) if has_last else None
        pieces.started()

    def _stage_pieces(
        self, info: np.ndarray, rows: int, starts: np.ndarray, extents: np.ndarray
    ) -> None:
        """Stage pieces planned by the kernel: ``info[k]`` = (rows, switch, items) of
        piece ``k``, ``starts`` (relative to the last piece's last row) and ``extents``
        of their items, in order. One entry of the batch for all of them when the
        writer's history allows, else piece by piece (what :class:`ChunkBatch` does
        either way)."""
        batch = self.out.batch
        items = info[:, 2]
        tables = self.pieces.tables
        jobs = [(t, span, starts, extents) for t, span in tables] if len(starts) else []
        if batch.add_pieces(rows, bool(info[0, 1]), jobs, items[items > 0].tolist()):
            return
        # Piece by piece: starts relative to each piece's own last row.
        after = np.repeat(rows - np.cumsum(info[:, 0]), items)  # rows staged after it
        starts = starts + after
        ends = np.cumsum(items).tolist()
        for (c, sw, k), end in zip(info.tolist(), ends):
            piece = []
            if k:
                piece = [
                    (t, span, starts[end - k : end], extents[end - k : end]) for t, span in tables
                ]
            batch.add(c, bool(sw), piece)
