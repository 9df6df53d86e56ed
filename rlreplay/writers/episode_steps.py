"""Each environment's current episode, as an adder records the steps it is given.

:class:`EpisodeSteps` writes checked steps into :class:`EpisodeRows` and ends and starts
episodes; :class:`EpisodePieces` cuts *pieces* (rows completed since the last piece, and
their items) when an episode ends or holds ``chunk_length`` complete rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.core.specs import Signature
from rlreplay.errors import InvalidArgumentError
from rlreplay.writers.autoreset import final_obs_source
from rlreplay.writers.hand_over import HandOver
from rlreplay.writers.sequence_items import SequenceItems
from rlreplay.writers.step_inputs import StepInputs


class EpisodeRows:
    """Per-environment buffers of episode rows, ``[num_envs, capacity, *shape]`` per field.

    Slot ``k`` of env ``i`` holds episode row ``base[i] + k``; see :meth:`keep_from`.

    Args:
        signature: the store's step signature.
        paths: the fields held (the adder's inputs).
        num_envs: environments.
        capacity: rows held per environment.
    """

    def __init__(self, signature: Signature, paths: Sequence[str], num_envs: int, capacity: int):
        self.capacity = capacity
        self.arrays = {
            p: np.zeros((num_envs, capacity, *signature[p].shape), dtype=signature[p].dtype)
            for p in paths
        }
        self.base = np.zeros(num_envs, dtype=np.int64)  # episode row held in slot 0
        # Each buffer as [num_envs * capacity, *shape] (views): one index per row written.
        self._flat = {
            p: a.reshape(num_envs * capacity, *a.shape[2:]) for p, a in self.arrays.items()
        }
        self._offsets = np.arange(num_envs, dtype=np.int64) * capacity

    def write(self, idx: np.ndarray, rows: np.ndarray, values: Mapping[str, np.ndarray]) -> None:
        """Write ``values[p][k]`` into episode row ``rows[k]`` of environment ``idx[k]``."""
        slots = rows - self.base[idx]
        for path, arr in values.items():
            self.arrays[path][idx, slots] = arr

    def write_first(self, idx: np.ndarray, count: int, obs: Mapping[str, np.ndarray]) -> None:
        """Write first observations into rows ``0 .. count - 1`` of starting episodes."""
        slots = self._offsets[idx]
        for r in range(count):
            for path, arr in obs.items():
                self._flat[path][slots + r] = arr

    def write_step(
        self,
        idx: np.ndarray,
        rows: np.ndarray,
        fields: Mapping[str, np.ndarray],
        obs: Mapping[str, np.ndarray],
    ) -> None:
        """Write one step of envs ``idx``: fields into row ``rows[k]``, obs into the next."""
        slots = rows - self.base[idx]
        for path, arr in fields.items():
            self.arrays[path][idx, slots] = arr
        slots += 1
        for path, arr in obs.items():
            self.arrays[path][idx, slots] = arr

    def write_all(
        self,
        rows: np.ndarray,
        fields: Mapping[str, np.ndarray],
        obs: Mapping[str, np.ndarray],
    ) -> None:
        """:meth:`write_step` for every environment (``rows[i]`` for environment ``i``)."""
        slots = rows - self.base
        slots += self._offsets  # flat positions in [num_envs * capacity]
        flat = self._flat
        for path, arr in fields.items():
            flat[path][slots] = arr
        slots += 1
        for path, arr in obs.items():
            flat[path][slots] = arr

    def rows(self, i: int, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Views of episode rows ``[lo, hi)`` of environment ``i``, per field."""
        b = int(self.base[i])
        return {p: a[i, lo - b : hi - b] for p, a in self.arrays.items()}

    def copy_rows(self, i: int, lo: int, hi: int, out: Mapping[str, np.ndarray]) -> None:
        """Copy episode rows ``[lo, hi)`` of environment ``i`` into ``out`` (per field)."""
        start = int(self._offsets[i] - self.base[i])  # flat position of episode row 0
        lo, hi = start + lo, start + hi
        for p, a in self._flat.items():
            out[p][:] = a[lo:hi]

    def field(self, path: str, i: int, lo: int, hi: int) -> np.ndarray:
        """View of field ``path`` at episode rows ``[lo, hi)`` of environment ``i``."""
        start = int(self._offsets[i] - self.base[i])  # flat position of episode row 0
        return self._flat[path][start + lo : start + hi]

    def keep_from(self, i: int, row: int) -> None:
        """Drop environment ``i``'s rows before episode row ``row``."""
        shift = row - int(self.base[i])
        if shift <= 0:
            return
        for arr in self.arrays.values():
            held = arr[i]
            held[: self.capacity - shift] = held[shift:]
            held[self.capacity - shift :] = 0
        self.base[i] = row

    def clear(self, idx: np.ndarray | slice) -> None:
        """Forget the episodes of environments ``idx`` (next ones start at row 0, zeroed)."""
        for arr in self.arrays.values():
            arr[idx] = 0
        self.base[idx] = 0


class EpisodePieces:
    """Cuts the episode rows of an adder's :class:`EpisodeSteps` into pieces and stages them.

    Args:
        episodes: the episodes whose rows are cut (their ``out`` is where pieces go).
        sizes: the adder's ``(pad, lag, span, chunk_length)``.
        computed: writes the adder's computed columns (:meth:`StreamAdder._computed`).
        items: the items an episode's rows now allow (:meth:`StreamAdder._items`).
        tables: ``(table, span)`` of each table the adder fills with ``items``.
        sequences: ``(table, rule, span)`` of each sequence table.
    """

    def __init__(
        self,
        episodes: EpisodeSteps,
        sizes: tuple[int, int, int, int],
        computed: Callable[..., None],
        items: Callable[..., tuple[np.ndarray, np.ndarray]],
        tables: list[tuple[Any, int]],
        sequences: list[tuple[Any, SequenceItems, int]],
    ):
        self.episodes = episodes
        self.out = episodes.out
        self.pad, self.lag, self.span, self.chunk_length = sizes
        self.computed = computed
        self.items = items
        self.tables = tables
        self.sequences = sequences
        self.last_stream: tuple[int, int] | None = None  # stream of the last piece
        self.copied_rows = 0
        self.appended_rows = 0
        # Lower bound on flush_ready calls before an open episode can hold a chunk.
        self._countdown = 0

    def flush_ready(self) -> None:
        """Cut a piece for every open episode holding a chunk of complete rows."""
        e = self.episodes
        if self.pad < self.chunk_length:
            self._countdown -= 1
            if self._countdown > 0:
                return
            # ready - appended >= chunk_length, ready = pad + max(0, steps - lag + 1)
            gap = self.chunk_length + self.lag - 1 - self.pad
            behind = np.where(e.active, e.steps - e.appended, 0)
            full = behind >= gap
            self._countdown = 1 if full.any() else gap - int(behind.max())
        else:
            ready = self.pad + np.maximum(0, e.steps - self.lag + 1)
            full = e.active & (ready - e.appended >= self.chunk_length)
        if full.any():
            for i in np.flatnonzero(full).tolist():
                self.cut(i, ended=False, terminated=False)

    def started(self) -> None:
        """Episodes started (padding rows count as complete): recount at the next call."""
        self._countdown = 0

    def end(self, idx: np.ndarray, terminated: np.ndarray) -> None:
        """Cut the last piece of the episodes of environments ``idx``."""
        for i, term in zip(idx.tolist(), terminated.tolist()):
            self.cut(i, ended=True, terminated=bool(term))

    def cut(self, i: int, ended: bool, terminated: bool) -> None:
        """Cut env ``i``'s piece: rows completed since the last (all if ``ended``), their items."""
        e, pad = self.episodes, self.pad
        lo = int(e.appended[i])
        steps = int(e.steps[i])
        hi = pad + (steps + 1 if ended else max(0, steps - self.lag + 1))  # complete rows
        stream = (i, int(e.serial[i]))
        rows, switch = 0, False
        if hi > lo:
            first = lo
            if self.last_stream != stream:
                first = max(0, lo - (self.span - 1))
                switch = True
                self.copied_rows += lo - first
            rows = hi - first
            out = self.out.reserve(rows)  # the rows go straight to the staging buffer
            e.rows.copy_rows(i, first, hi, out)
            self.computed(i, first, hi, ended, terminated, out)
            self.last_stream = stream
            self.appended_rows += rows
            e.appended[i] = hi
        jobs = []
        anchors, extents = self.items(i, hi, ended, terminated)
        if len(anchors):
            starts = anchors - hi  # one array for every table (nobody writes to it)
            jobs += [(t, span, starts, extents) for t, span in self.tables]
        for table, rule, span in self.sequences:
            starts, lengths = rule.items(i, hi, pad, steps, ended)
            if len(starts):
                jobs.append((table, span, starts - hi, lengths))
        if rows or jobs:
            self.out.stage(rows, switch, jobs)
        if not ended:
            self.out.drops.append((i, max(0, hi - (self.span - 1))))


_NO_ENVS = np.zeros(0, dtype=np.int64)


class EpisodeSteps:
    """The episodes of ``num_envs`` environments: open or awaiting reset, steps, rows cut so far.

    Args:
        num_envs: environments.
        mode: the autoreset mode, ``"next_step"`` or ``"same_step"``.
        pad: padding rows at episode start (frame stacks).
        chunk_length: the adder's ``chunk_length``.
        inputs: the adder's input checks.
        rows: the episode rows.
        out: where cut pieces are staged.
        timeout: seconds a writer call may wait.
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
        self.open = 0  # environments active (an open episode)
        self.episodes = 0  # episodes ended

    def record(
        self,
        fields: dict[str, np.ndarray],
        obs: dict[str, np.ndarray],
        term: np.ndarray,
        trunc: np.ndarray,
        info: Any,
    ) -> None:
        """Record one checked step of every environment; environments without an open episode
        are left alone, and a next-step one waiting for its reset starts its next episode.
        InvalidArgumentError (nothing changed) before any episode started or for final
        observations that do not fit."""
        if not self.stepping:
            raise InvalidArgumentError("add() was called before reset(); call reset(obs) first")
        done = term | trunc
        any_done = bool(done.any())
        ended = _NO_ENVS
        if any_done:  # an environment waiting for its reset is not active
            ended = np.flatnonzero(done if self.open == self.num_envs else done & self.active)
        source = final_obs_source(self.mode, info, any_done)
        final = obs
        if source is not None and len(ended):
            final = self.inputs.final_observations(obs, source, ended)
        # Everything is checked: the adder changes from here on.
        self.out.chunks.drain(self.timeout)
        restart = np.flatnonzero(self.awaiting_reset) if self.open < self.stepping else _NO_ENVS
        if self.stepping == self.num_envs:
            # Whole arrays, no gathers: a waiting environment's ignored step lands in the
            # first rows of its ended episode (``finish`` set its step count and base to
            # 0), which its restart below clears.
            self.rows.write_all(self.pad + self.steps if self.pad else self.steps, fields, final)
            self.steps += 1
        elif self.open:
            idx = np.flatnonzero(self.active)
            fields = {p: a[idx] for p, a in fields.items()}
            final = {p: a[idx] for p, a in final.items()}
            self.rows.write_step(idx, self.pad + self.steps[idx], fields, final)
            self.steps[idx] += 1
        if len(ended):
            self.finish(ended, term[ended])
        self.pieces.flush_ready()
        self.out.release(self.rows)
        if self.mode == "same_step":
            restart = ended
        else:
            self.awaiting_reset[ended] = True
        if len(restart):
            self.start(restart, {p: a[restart] for p, a in obs.items()})
            if self.pad >= self.chunk_length:  # new episodes' padding rows fill a chunk
                self.pieces.flush_ready()
                self.out.release(self.rows)
        if len(ended) or len(restart):
            self.count_stepping()

    def start(self, idx: np.ndarray, obs: dict[str, np.ndarray]) -> None:
        """Start episodes of environments ``idx`` with first observations ``obs``."""
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

    def count_stepping(self) -> None:
        """Recount the open episodes and the environments that step (open, or waiting for a
        next-step reset; ``awaiting_reset`` implies not ``active``)."""
        self.open = int(np.count_nonzero(self.active))
        self.stepping = self.open + int(np.count_nonzero(self.awaiting_reset))

    def finish(self, idx: np.ndarray, terminated: np.ndarray) -> None:
        """End the episodes of environments ``idx``: stage their last rows and items. Their
        buffers are cleared when their next episodes start."""
        self.pieces.end(idx, terminated)
        sel = _selector(idx)
        self.active[sel] = False
        self.steps[sel] = 0
        self.appended[sel] = 0
        self.rows.base[sel] = 0
        self.episodes += len(idx)


def _selector(idx: np.ndarray) -> np.ndarray | slice:
    """``idx`` as an index: one environment as a slice (cheaper than an index array)."""
    if len(idx) == 1:
        j = int(idx[0])
        return slice(j, j + 1)
    return idx
