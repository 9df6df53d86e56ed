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

Without the compiled plan (no compiler, or ``RLREPLAY_NO_EXTENSION=1``),
:meth:`NStepBlock._settle_numpy` does the same with vectorised numpy. The writer
receives exactly what the per-call path gives it: same rows, same items in the same
order per table, same counters (a property test compares the three over random episode
ends, truncations, autoreset modes and calls that settle early).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core._compiled import load_kernel
from rlreplay.writers.autoreset import final_obs_source
from rlreplay.writers.episode_steps import EpisodeSteps

# The compiled plan of a block (rlreplay/writers/_blocks.c), or None: the numpy settle.
_kernel = load_kernel("rlreplay.writers._blocks")


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
        # The compiled plan's outputs (see _settle_compiled), sized for the worst block.
        self._plan = None if _kernel is None else _kernel.plan
        self._copy_rows = None if _kernel is None else _kernel.copy_rows
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
        if self._plan is not None:
            self._settle_compiled(K)
        else:
            self._settle_numpy(K)

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

    def _settle_compiled(self, K: int) -> None:
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
        episodes.waiting = np.flatnonzero(awaiting)
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

    def _settle_numpy(self, K: int) -> None:
        """:meth:`settle` in numpy alone (without the compiled plan), same results: every
        step of the bookkeeping a vectorised operation over the block's ``[calls, num_envs]``
        grid."""
        a = self.adder
        episodes, rows, pieces = self.episodes, self.episode_rows, self.pieces
        E, W = a.num_envs, self.width
        pad, n, lag, chunk, span, stack = a.pad, a.n, a.lag, a.chunk_length, a.span, a.stack
        # Episodes that end: done, unless the step is the ignored one after an end.
        done = self.terminated[:K] | self.truncated[:K]
        if self.same_step:
            ended = done
        else:
            ended = done.copy()
            ended[0] &= ~episodes.awaiting_reset
            for k in range(1, K):
                ended[k] &= ~ended[k - 1]
        envs = np.arange(E, dtype=np.int64)

        # -- which calls step, where each env's rows go in the scratch buffer
        aw0 = episodes.awaiting_reset.copy()
        if self.same_step:
            stepping = np.ones((K, E), dtype=bool)
            restart = np.zeros((K + 1, E), dtype=bool)  # a new episode from this call on
            restart[1:] = ended
            advance = 1 + ended * (1 + pad)
        else:
            ignored = np.empty((K, E), dtype=bool)
            ignored[0] = aw0
            ignored[1:] = ended[:-1]
            stepping = ~ignored
            restart = np.zeros((K + 1, E), dtype=bool)
            restart[:K] = ignored
            advance = stepping.astype(np.int64) + ended + ignored * pad
        steps0 = episodes.steps.copy()
        base0 = rows.base.copy()
        # Stream position (scratch row) of each env's current row before the block: its
        # held rows start at position 0 (episode row base0); an env waiting for its
        # reset starts its next episode at 0.
        cur0 = np.where(aw0, 0, pad + steps0 - base0)
        ends_at = np.cumsum(advance, axis=0)
        cur = cur0 + ends_at - advance  # [K, E] position of the current row at call k
        cur_end = cur0 + ends_at[-1]
        # Steps taken before each call in its episode: steps before the block for the
        # episode open at its start, counted from the last restart otherwise.
        taken = np.zeros((K + 1, E), dtype=np.int64)
        np.cumsum(stepping, axis=0, out=taken[1:])
        seg = np.cumsum(restart, axis=0)  # restarts so far ([K + 1, E])
        last = np.where(restart, np.arange(K + 1)[:, None], -1)
        np.maximum.accumulate(last, axis=0, out=last)
        offset = np.where(last >= 0, taken[np.maximum(last, 0), envs], -steps0)
        before = taken - offset  # [K + 1, E]: steps of the episode before call k
        s = before[:K]
        first_ep = seg == 0  # still the episode open at the block's start
        a0 = np.where(first_ep, episodes.appended, 0)  # rows handed over before the block
        ni0 = np.where(first_ep, self.next_item, 0)  # its next item anchor
        serial = episodes.serial + seg
        start = np.where(first_ep, base0, 0)  # its first held row

        # -- the scratch rows: held rows, then each call's step and observations
        flat = self._flat
        held = int((cur0 + 1).max())
        for p in self.field_paths:
            scratch = self.scratch[p]
            scratch[:, :held] = rows.arrays[p][:, :held]
            scratch[:, held : int(cur_end.max()) + 2] = 0
            if aw0.any():
                scratch[aw0, :held] = 0
        for p in self.obs_paths:
            self.scratch[p][:, :held] = rows.arrays[p][:, :held]
        row0 = envs * W
        pos = cur + row0  # flat positions of the current rows
        if stepping.all():
            at, step_k, step_e = pos.reshape(-1), slice(None), slice(None)
            for p in self.field_paths:
                flat[p][at] = self.fields[p][:K].reshape(K * E, *flat[p].shape[1:])
            for p in self.obs_paths:
                flat[p][at + 1] = self.obs[p][:K].reshape(K * E, *flat[p].shape[1:])
        else:
            step_k, step_e = np.nonzero(stepping)
            at = pos[step_k, step_e]
            for p in self.field_paths:
                flat[p][at] = self.fields[p][step_k, step_e]
            for p in self.obs_paths:
                flat[p][at + 1] = self.obs[p][step_k, step_e]
        # A new episode's first observation fills its padding rows and first row.
        if self.same_step:
            rk, re = np.nonzero(ended)
            if len(rk):
                first_at = pos[rk, re] + 2
                for p in self.obs_paths:
                    values = self.reset_obs[p][rk, re]
                    for j in range(pad + 1):
                        flat[p][first_at + j] = values
        else:
            rk, re = np.nonzero(ignored)
            if len(rk):
                first_at = pos[rk, re]
                for p in self.obs_paths:
                    values = self.obs[p][rk, re]
                    for j in range(pad + 1):
                        flat[p][first_at + j] = values

        # -- the pieces: ended episodes and full chunks, by call, ended first, by env
        ek, ee = np.nonzero(ended)
        s_e = s[ek, ee]
        a0_e = a0[ek, ee]
        ready_e = pad + np.maximum(0, s_e - lag + 1)  # complete rows before the last step
        lo_e = a0_e + chunk * ((ready_e - a0_e) // chunk)
        hi_e = pad + s_e + 2
        after = s + 1  # steps after the call's step
        ready = pad + np.maximum(0, after - lag + 1)
        grown = ready - a0[:K]
        full = stepping & ~ended & (grown >= chunk) & (grown % chunk == 0)
        ck, ce = np.nonzero(full)
        hi_c = ready[ck, ce]
        lo_c = hi_c - chunk
        key = np.concatenate((ek * (2 * E) + ee, ck * (2 * E) + E + ce))
        order = np.argsort(key, kind="stable")
        pk = np.concatenate((ek, ck))[order]
        pe = np.concatenate((ee, ce))[order]
        lo = np.concatenate((lo_e, lo_c))[order]
        hi = np.concatenate((hi_e, hi_c))[order]
        is_end = np.zeros(len(key), dtype=bool)
        is_end[: len(ek)] = True
        is_end = is_end[order]
        total = np.concatenate((s_e + 1, after[ck, ce]))[order]  # episode steps so far
        z = (cur - pad - s)[pk, pe] + row0[pe]  # flat position of episode row 0
        ni = ni0[pk, pe]
        first_item = np.maximum(ni, lo - n - stack + 1)
        stop = np.where(is_end, total, np.maximum(first_item, hi - n - stack + 1))
        term = self.terminated[:K][pk, pe]
        stream_serial = serial[pk, pe]
        if len(pk):
            self._stage_rows(pe, stream_serial, z, lo, hi, total, is_end, term, first_item, stop)

        # -- the episodes after the block
        waiting = ended[-1] if not self.same_step else self._no_ends
        steps_end = before[K]
        a0_end = a0[K]
        ready_end = pad + np.maximum(0, steps_end - lag + 1)
        appended_end = a0_end + chunk * ((ready_end - a0_end) // chunk)
        cut = appended_end > a0_end
        ni_end = np.where(cut, np.maximum(ni0[K], appended_end - n - stack + 1), ni0[K])
        base_end = np.where(cut, np.maximum(start[K], appended_end - (span - 1)), start[K])
        z_end = cur_end - pad - steps_end
        held_end = pad + steps_end + 1 - base_end
        if waiting.any():
            steps_end[waiting] = 0
            appended_end[waiting] = 0
            ni_end[waiting] = 0
            base_end[waiting] = 0
            held_end[waiting] = 0
        cap = rows.capacity
        j = np.arange(cap)
        src = row0[:, None] + np.minimum(z_end + base_end, W - cap)[:, None] + j
        beyond = j >= held_end[:, None]
        for p, arr in rows.arrays.items():
            np.take(flat[p], src, axis=0, out=arr)
            if p in self.fields:
                arr[beyond] = 0
        episodes.active[:] = ~waiting
        episodes.awaiting_reset[:] = waiting
        episodes.steps[:] = steps_end
        episodes.appended[:] = appended_end
        episodes.serial[:] = serial[K]
        episodes.waiting = np.flatnonzero(waiting)
        episodes.episodes += len(ek)
        rows.base[:] = base_end
        self.next_item[:] = ni_end
        pieces.started()


    def _stage_rows(
        self,
        env: np.ndarray,
        serial: np.ndarray,
        z: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
        total: np.ndarray,
        ended: np.ndarray,
        terminated: np.ndarray,
        first_item: np.ndarray,
        stop: np.ndarray,
    ) -> None:
        """Stage the pieces (in order): rows ``[lo, hi)`` of the episode whose row 0 is
        at flat scratch position ``z``, with context rows where a piece does not continue
        the last piece's stream, and items ``first_item .. stop - 1``."""
        a = self.adder
        pieces = self.pieces
        n, stack = a.n, a.stack
        has = hi > lo
        with_rows = np.flatnonzero(has)
        first = lo.copy()
        switch = np.zeros(len(env), dtype=bool)
        if len(with_rows):
            e, s = env[with_rows], serial[with_rows]
            last_e, last_s = pieces.last_stream or (-1, -1)
            prev_e = np.concatenate(([last_e], e[:-1]))
            prev_s = np.concatenate(([last_s], s[:-1]))
            sw = (e != prev_e) | (s != prev_s)
            switch[with_rows] = sw
            lw = lo[with_rows]
            first[with_rows] = np.where(sw, np.maximum(0, lw - (a.span - 1)), lw)
            pieces.last_stream = (int(e[-1]), int(s[-1]))
        counts = np.where(has, hi - first, 0)
        rows_total = int(counts.sum())
        pieces.copied_rows += int((lo - first).sum())
        pieces.appended_rows += rows_total
        ends = np.cumsum(counts)
        if rows_total:
            out = self.out.reserve(rows_total)
            row = np.arange(rows_total, dtype=np.int64) + np.repeat(first - (ends - counts), counts)
            pos = row + np.repeat(z, counts)
            for p, f in self._flat.items():
                np.take(f, pos, axis=0, out=out[p])
            self._returns(
                row,
                pos,
                np.repeat(total, counts),
                np.repeat(ended, counts),
                np.repeat(terminated, counts),
                out,
            )
        items = stop - first_item
        count = int(items.sum())
        iends = np.cumsum(items)
        t = np.arange(count, dtype=np.int64) + np.repeat(first_item - (iends - items), items)
        left = np.repeat(total, items) - t
        extent = np.where(np.repeat(ended, items), np.minimum(left, n), n) + stack
        rel = t - np.repeat(hi, items)
        tables = self.pieces.tables
        batch = self.out.batch
        for c, sw, i0, i1 in zip(
            counts.tolist(), switch.tolist(), (iends - items).tolist(), iends.tolist()
        ):
            jobs = []
            if i1 > i0:
                starts, ext = rel[i0:i1], extent[i0:i1]
                jobs = [(table, span, starts, ext) for table, span in tables]
            if c or jobs:
                batch.add(c, sw, jobs)


    def _returns(
        self,
        row: np.ndarray,
        pos: np.ndarray,
        total: np.ndarray,
        ended: np.ndarray,
        terminated: np.ndarray,
        out: dict[str, np.ndarray],
    ) -> None:
        """The n-step return and discount of every staged row (see
        :class:`~rlreplay.writers.nstep.NStepTransitionAdder`): episode row ``row[k]`` of
        an episode of ``total[k]`` steps so far, its reward at flat position ``pos[k]``."""
        a = self.adder
        n, pad = a.n, a.pad
        step = row - pad  # < 0: padding rows, no item is anchored there
        left = total - step  # steps from this row's to the episode's end (so far)
        reward = self._flat["reward"]
        last = len(reward) - 1
        # An open episode's complete rows have n rewards; an ended one's last rows fewer
        # (rewards past the final row count as zero, as in the per-piece cut).
        # [rows, n] windows of float64 rewards times discount powers: the per-piece cut's
        # product, so that the float32 returns round the same way.
        window = np.minimum(pos[:, None] + np.arange(n), last)
        r = reward[window].astype(np.float64)
        r[left[:, None] <= np.arange(n)] = 0.0
        ret = r @ self.weights
        padding = step < 0
        ret[padding] = 0.0
        out["n_step_return"][:] = ret
        disc = np.where(ended, self.tail[np.clip(left, 0, n)], self.powers[n])
        # No bootstrapping from a terminal state: the last n steps of a terminated episode.
        disc[terminated & (left <= n)] = 0.0
        disc[padding] = 0.0
        out["discount"][:] = disc
