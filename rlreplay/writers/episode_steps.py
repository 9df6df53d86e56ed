"""Each environment's current episode, as an adder records the steps it is given.

An adder (:class:`~rlreplay.writers.stream.StreamAdder`) checks a call's arguments, then
hands the checked step to :class:`EpisodeSteps`, which writes it into each environment's
episode rows, ends the episodes that ended (their last piece is cut by
:class:`~rlreplay.writers.pieces.EpisodePieces`) and starts new ones as the autoreset
mode says (:mod:`rlreplay.writers.autoreset`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.errors import InvalidArgumentError
from rlreplay.writers.autoreset import final_obs_source
from rlreplay.writers.episode_rows import EpisodeRows
from rlreplay.writers.hand_over import HandOver
from rlreplay.writers.step_inputs import StepInputs

_NO_ENVS = np.zeros(0, dtype=np.int64)


class EpisodeSteps:
    """The episodes of ``num_envs`` environments: which are open, which wait for their
    reset (next-step mode), their steps, how many rows of each were cut into pieces
    (``appended``), and their rows.

    Args:
        num_envs: environments.
        mode: the autoreset mode, ``"next_step"`` or ``"same_step"``.
        pad: padding rows at episode start (frame stacks).
        chunk_length: the adder's ``chunk_length``.
        inputs: the adder's input checks (final observations of same-step envs).
        rows: the episode rows.
        out: where cut pieces are staged (its ``release`` drops rows after a cut).
        timeout: seconds a writer call may wait (pending chunks are retried first).
    """

    def __init__(
        self,
        num_envs: int,
        mode: str,
        pad: int,
        chunk_length: int,
        inputs: StepInputs,
        rows: EpisodeRows,
        out: HandOver,
        timeout: float | None,
    ):
        self.num_envs = num_envs
        self.mode = mode
        self.pad = pad
        self.chunk_length = chunk_length
        self.inputs = inputs
        self.rows = rows
        self.out = out
        self.timeout = timeout
        self.pieces: Any = None  # the adder's EpisodePieces, set once both exist
        n = num_envs
        self.active = np.zeros(n, dtype=bool)
        self.awaiting_reset = np.zeros(n, dtype=bool)
        self.steps = np.zeros(n, dtype=np.int64)  # transitions in the current episode
        self.appended = np.zeros(n, dtype=np.int64)  # episode rows cut into pieces so far
        self.serial = np.zeros(n, dtype=np.int64)  # episodes started per environment
        self.stepping = 0  # environments active or waiting for their reset
        self.waiting = _NO_ENVS  # environments waiting for their reset (next-step mode)
        self.episodes = 0  # episodes ended

    def record(
        self,
        fields: dict[str, np.ndarray],
        obs: dict[str, np.ndarray],
        term: np.ndarray,
        trunc: np.ndarray,
        info: Any,
    ) -> None:
        """Record one checked step of every environment (see :meth:`StreamAdder.add`).

        Raises:
            InvalidArgumentError: before any episode started, or for final observations
                that do not fit; nothing changes then.
        """
        if self.stepping == self.num_envs:
            self.step_all(fields, obs, term, trunc, info)
        else:
            self.step_some(fields, obs, term, trunc, info)

    def start(self, idx: np.ndarray, obs: dict[str, np.ndarray]) -> None:
        """Start episodes of environments ``idx`` with first observations ``obs[p][k]``
        for ``idx[k]``."""
        if len(idx) == 0:
            return
        self.rows.clear(idx)
        self.active[idx] = True
        self.awaiting_reset[idx] = False
        self.steps[idx] = 0
        self.appended[idx] = 0
        self.serial[idx] += 1
        self.rows.write_first(idx, self.pad + 1, obs)
        self.pieces.started()

    def step_all(
        self,
        fields: dict[str, np.ndarray],
        obs: dict[str, np.ndarray],
        term: np.ndarray,
        trunc: np.ndarray,
        info: Any,
    ) -> None:
        """:meth:`StreamAdder.add` when every environment steps or starts a new episode
        (the common case): the step is written for every environment at once. An
        environment that waits for its reset (next-step mode) gets its ignored step's
        values written into its old buffer, which is cleared as its new episode starts."""
        done = term | trunc
        any_done = bool(done.any())
        ended = _NO_ENVS
        if any_done:
            ended = np.flatnonzero(done & self.active if len(self.waiting) else done)
        source = final_obs_source(self.mode, info, any_done)
        final = obs
        if source is not None and len(ended):
            final = self.inputs.final_observations(obs, source, ended)
        # Everything is checked: the adder changes from here on.
        self.out.chunks.drain(self.timeout)
        self.rows.write_all(self.pad + self.steps if self.pad else self.steps, fields, final)
        self.steps += 1
        if len(ended):
            self.finish(ended, term[ended])
        self.pieces.flush_ready()
        self.out.release(self.rows)
        restart = ended if self.mode == "same_step" else self.waiting
        if self.mode == "next_step":
            self.awaiting_reset[ended] = True
            self.waiting = ended
        if len(restart):  # finished: nothing appended; the ignored steps' rows are cleared
            sel = _selector(restart)
            self.rows.clear(sel)
            self.active[sel] = True
            self.awaiting_reset[sel] = False
            self.steps[sel] = 0  # a waiting env's ignored step was counted
            self.serial[sel] += 1
            self.rows.write_first(restart, self.pad + 1, {p: a[sel] for p, a in obs.items()})
            self.pieces.started()
            if self.pad >= self.chunk_length:  # new episodes' padding rows fill a chunk
                self.pieces.flush_ready()
                self.out.release(self.rows)

    def step_some(
        self,
        fields: dict[str, np.ndarray],
        obs: dict[str, np.ndarray],
        term: np.ndarray,
        trunc: np.ndarray,
        info: Any,
    ) -> None:
        """:meth:`StreamAdder.add` when some environments have no open episode (before their
        :meth:`reset`, or after :meth:`end_episode`): those are left alone."""
        done = term | trunc
        if self.mode == "next_step":
            resetting = self.awaiting_reset.copy()
            valid = self.active & ~resetting
        else:
            resetting = None
            valid = self.active.copy()
        if not valid.any() and (resetting is None or not resetting.any()):
            raise InvalidArgumentError("add() was called before reset(); call reset(obs) first")
        any_done = bool(done.any())
        ended = np.flatnonzero(valid & done) if any_done else _NO_ENVS
        source = final_obs_source(self.mode, info, any_done)
        final = obs
        if source is not None and len(ended):
            final = self.inputs.final_observations(obs, source, ended)
        # Everything is checked: the adder changes from here on.
        self.out.chunks.drain(self.timeout)
        idx = np.flatnonzero(valid)
        if len(idx):
            fields = {p: a[idx] for p, a in fields.items()}
            final = {p: a[idx] for p, a in final.items()}
            self.rows.write_step(idx, self.pad + self.steps[idx], fields, final)
            self.steps[idx] += 1
            if len(ended):
                self.finish(ended, term[ended])
        self.pieces.flush_ready()
        self.out.release(self.rows)
        restart = _NO_ENVS
        if resetting is not None and resetting.any():
            restart = np.flatnonzero(resetting)
        if self.mode == "same_step":
            restart = ended
        elif len(ended):
            self.awaiting_reset[ended] = True
        if len(restart):
            self.start(restart, {p: a[restart] for p, a in obs.items()})
            if self.pad >= self.chunk_length:  # new episodes' padding rows fill a chunk
                self.pieces.flush_ready()
                self.out.release(self.rows)
        self.count_stepping()

    def count_stepping(self) -> None:
        """Recount the environments that step (an open episode, or waiting for the reset
        of a next-step env): a step is written for all at once when all do."""
        self.stepping = int(np.count_nonzero(self.active | self.awaiting_reset))
        self.waiting = np.flatnonzero(self.awaiting_reset)

    def finish(self, idx: np.ndarray, terminated: np.ndarray) -> None:
        """End the episodes of environments ``idx``: stage their last rows and items. Their
        buffers are cleared when their next episodes start; until then a step written for
        every environment lands in their first rows (step count and ``base`` 0)."""
        self.pieces.end(idx, terminated)
        sel = _selector(idx)
        self.active[sel] = False
        self.steps[sel] = 0
        self.appended[sel] = 0
        self.rows.base[sel] = 0
        self.episodes += len(idx)


def _selector(idx: np.ndarray) -> np.ndarray | slice:
    """``idx`` (distinct environments) as an index: one environment as a slice,
    which numpy reads and writes through without the cost of an index array."""
    if len(idx) == 1:
        j = int(idx[0])
        return slice(j, j + 1)
    return idx

