"""An n-step adder's calls recorded in blocks and cut into pieces a block at a time.

:class:`NStepBlock` keeps a call to checking its step and copying it into block arrays;
:meth:`NStepBlock.settle` replays a block's bookkeeping with a compiled plan
(``rlreplay/writers/_blocks.c``), so per-episode work does not dominate. The writer
receives exactly what the per-call path gives it. See docs/adders.md.
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
    """Records a batched :class:`~rlreplay.writers.nstep.NStepTransitionAdder`'s calls and
    settles them a block at a time (no sequence tables, fewer padding rows than a chunk).

    Args:
        adder: the adder (its sizes and tables).
        every: calls per block (the adder's ``hand_over_every``).
        episodes: the adder's episodes, updated on :meth:`settle`.
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
        # Rows those calls wrote; at ``every * num_envs`` the block settles early.
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
        # Scratch rows per environment: held rows, then each block's rows after them.
        cap = self.episode_rows.capacity
        self.width = 3 * cap + 2 * k * (2 + a.pad) + 2
        self.scratch = {
            p: np.zeros((e, self.width, *sig[p].shape), dtype=sig[p].dtype) for p in inputs.paths
        }
        self._flat = {p: s.reshape(e * self.width, *s.shape[2:]) for p, s in self.scratch.items()}
        # The compiled plan's outputs (see _run_plan), sized for the worst block.
        self._plan = _kernel.plan
        self._copy_rows = _kernel.copy_rows
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
        # Where each env's held rows start in its scratch rows (when _in_scratch).
        self._origin = np.zeros(e, dtype=np.int64)
        self._in_scratch = False

    def record(
        self,
        fields: dict[str, np.ndarray],
        obs: dict[str, np.ndarray],
        term: np.ndarray,
        trunc: np.ndarray,
        info: Any,
    ) -> bool:
        """Record one checked step of every environment; ``False`` (nothing recorded) when some do
        not step. InvalidArgumentError (nothing changed) for final observations that do not fit
        or an env in the other autoreset mode."""
        a = self.adder
        episodes = self.episodes
        if episodes.stepping != a.num_envs:
            return False
        final = obs
        ends = 0
        if self.same_step or not (info is None or (type(info) is dict and not info)):
            # Final observations: read in same-step mode, refused in next-step mode.
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

    def settle(self) -> None:
        """Do what the recorded calls do: stage their pieces in order and update the episodes."""
        K = self.calls
        if K == 0:
            return
        self.calls = 0
        self.rows = 0
        self._run_plan(K)

    def sync(self) -> None:
        """Settle, and move the held rows back to the episode rows (for the per-call path)."""
        self.settle()
        if self._in_scratch:
            self._write_back()

    def _write_back(self) -> None:
        """Copy each env's held rows from its scratch rows back to its episode rows."""
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
        """Put each env's held rows first in its scratch rows, stored fields zero past them."""
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
        """:meth:`settle` with the compiled plan; numpy moves the rows."""
        a = self.adder
        episodes, rows, pieces = self.episodes, self.episode_rows, self.pieces
        E, W, pad, n = a.num_envs, self.width, a.pad, a.n
        flat = self._flat
        awaiting = episodes.awaiting_reset
        # Where the block's rows would not fit after the held rows, move those back.
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
        if count:
            out = self.out.reserve(count)
            pos = o["rows"][:count]
            for p, f in flat.items():
                copy(out[p], None, f, pos, 0)
            # float64 reward windows times discount powers, as the per-piece cut does
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
        """Stage the kernel's pieces (``info[k]`` = rows, switch, items): one batch entry when the
        history allows, else piece by piece."""
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
