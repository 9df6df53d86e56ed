"""Item draws: choosing which items a sample returns and reading their data.

Under ``max_times_sampled`` a batch behaves as consecutive single samples: independent
draws stand up to the first that exhausts an item, the rest is drawn one at a time.
:class:`DrawPlan` owns the gather plan and the reusable batch buffers. Every method
expects the table's lock held.
"""

from __future__ import annotations

import os

import numpy as np

from rlreplay.core._compiled import load_kernel
from rlreplay.core.batch_buffers import BatchBuffers
from rlreplay.core.gather import gather_variable
from rlreplay.core.item_index import UNKEPT_PRIORITY, ItemIndex
from rlreplay.core.keys import has_duplicates, make_keys
from rlreplay.core.layout import ItemLayout
from rlreplay.core.sample import Sample, SampleInfo
from rlreplay.core.storage import StepStore
from rlreplay.errors import EmptyTableError

_kernel = load_kernel("rlreplay.core._draws")


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


# A batch of several MB is copied on two threads where two cores are there.
GATHER_THREADS = min(2, _usable_cores())


def occurrence_rank(slots: np.ndarray) -> np.ndarray:
    """For each entry, how many earlier entries hold the same slot (0 for a first)."""
    order = np.argsort(slots, kind="stable")
    sorted_slots = slots[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_slots)) + 1]
    rank = np.empty(len(slots), dtype=np.int64)
    rank[order] = np.arange(len(slots)) - np.repeat(starts, np.diff(np.r_[starts, len(slots)]))
    return rank


class DrawPlan:
    """Selection of sampled items and the gather of their windows (lock held).

    Args:
        index: the table's items.
        store: the step store the items' windows read.
        layout: the table's item layout.
        max_times_sampled: remove an item after this many samples (0: never).
    """

    def __init__(
        self, index: ItemIndex, store: StepStore, layout: ItemLayout, max_times_sampled: int
    ):
        self.index = index
        self.store = store
        self.layout = layout
        self.max_times_sampled = max_times_sampled
        self._gather_plan = self._plan_gather()
        self._batch_buffers = BatchBuffers()

    def replan(self) -> None:
        """Take the store's columns afresh (lock held), after a restore replaced them."""
        self._gather_plan = self._plan_gather()

    def draw(self, n: int, buffers: BatchBuffers | None = None) -> Sample:
        """Sample ``n`` items into ``buffers`` (default the plan's own), removing exhausted ones."""
        index = self.index
        sampler = index.sampler
        size = index.size
        min_probability = sampler.min_probability()
        if sampler.deterministic:
            slots = self._deterministic_picks(n)
            probabilities = np.ones(len(slots))
        else:
            slots, probabilities = sampler.sample(n, index.rng)
            if self.max_times_sampled:
                slots, probabilities = self._limited(slots, probabilities)
        keys, priorities, times = self._mark_sampled(slots)
        data = self._gather(slots, buffers)
        if self.max_times_sampled:
            done = np.unique(slots[times >= self.max_times_sampled])
            if len(done):
                index.remove(done)
        info = SampleInfo(keys, probabilities, priorities, times, size, min_probability)
        return Sample(data, info)

    def _mark_sampled(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keys, priorities and sample counts of the drawn slots; counts first draws."""
        index = self.index
        index.changes.note(slots)
        if _kernel is not None:
            slots = np.ascontiguousarray(slots, dtype=np.int64)
            n = len(slots)
            keys = np.empty(n, dtype=np.int64)
            # Records without priorities leave them as filled here.
            priorities = np.empty(n) if index.keeps_priorities else np.full(n, UNKEPT_PRIORITY)
            times = np.empty(n, dtype=np.uint32)
            _kernel.mark_sampled(slots, index.slot_bytes, keys, priorities, times, index.origin)
        else:
            if has_duplicates(slots):
                times = self._count_samples(slots)
            else:
                times = index.times_sampled[slots] + np.uint32(1)
                index.times_sampled[slots] = times
            keys = make_keys(slots, index.generation[slots], index.origin)
            priorities = index.priority[slots]
        index.counts["sampled_items"] += int(np.count_nonzero(times == 1))
        return keys, priorities, times

    def _count_samples(self, slots: np.ndarray) -> np.ndarray:
        """Increment times_sampled; each entry sees the count as of its own draw."""
        times_sampled = self.index.times_sampled
        times = times_sampled[slots].astype(np.int64) + occurrence_rank(slots) + 1
        np.add.at(times_sampled, slots, 1)
        return times

    def _deterministic_picks(self, n: int) -> np.ndarray:
        index = self.index
        if self.max_times_sampled == 0:
            return index.sampler.sample(n, index.rng)[0]
        order = index.sampler.choose_victims(n, index.rng)  # the n first, in order
        left = self.max_times_sampled - index.times_sampled[order].astype(np.int64)
        return np.repeat(order, left)[:n]

    def _limited(
        self, slots: np.ndarray, probabilities: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Independent draws as consecutive single samples under ``max_times_sampled``."""
        n = len(slots)
        times = self.index.times_sampled[slots].astype(np.int64) + occurrence_rank(slots) + 1
        exhausting = np.flatnonzero(times >= self.max_times_sampled)
        if len(exhausting) == 0 or exhausting[0] == n - 1:
            return slots, probabilities
        k = int(exhausting[0]) + 1
        more, more_probabilities = self._sequential_picks(n - k, slots[:k])
        slots = np.concatenate([slots[:k], more])
        return slots, np.concatenate([probabilities[:k], more_probabilities])

    def _sequential_picks(self, n: int, drawn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` items one at a time after ``drawn``, hiding exhausted ones; may end early."""
        sampler, rng, times_sampled = self.index.sampler, self.index.rng, self.index.times_sampled
        slots = np.empty(n, dtype=np.int64)
        probs = np.empty(n)
        extra: dict[int, int] = {}
        for s in drawn.tolist():
            extra[s] = extra.get(s, 0) + 1
        hidden = [s for s, c in extra.items() if times_sampled[s] + c >= self.max_times_sampled]
        if hidden:
            sampler.delete(np.array(hidden, dtype=np.int64))
        for i in range(n):
            if sampler.size == 0:
                slots, probs = slots[:i], probs[:i]
                break
            try:
                s, p = sampler.sample(1, rng)
            except EmptyTableError:
                slots, probs = slots[:i], probs[:i]
                break
            s0 = int(s[0])
            slots[i], probs[i] = s0, p[0]
            extra[s0] = extra.get(s0, 0) + 1
            if times_sampled[s0] + extra[s0] >= self.max_times_sampled:
                sampler.delete(np.array([s0]))
                hidden.append(s0)
        if hidden:
            arr = np.array(hidden)
            sampler.insert(arr, self.index.priority[arr])
        return slots, probs

    def _plan_gather(self) -> list[tuple[str, np.ndarray, int, np.ndarray | None]]:
        """Per output field: (name, column, row offset, sequence step offsets or None)."""
        lanes = self.store.lanes
        plan = []
        for name, win in self.layout.windows.items():
            col = self.store.columns[win.column]
            if win.length is None:
                plan.append((name, col, win.offset * lanes, None))
            else:
                steps = (np.arange(win.length, dtype=np.int64) + win.offset) * lanes
                plan.append((name, col, 0, steps))
        return plan

    def _gather(self, slots: np.ndarray, buffers: BatchBuffers | None) -> dict[str, np.ndarray]:
        extent = self.index.extent
        if extent is not None:
            return gather_variable(self.store, self.layout, slots, extent[slots])
        cap = self.store.capacity
        buffers = self._batch_buffers if buffers is None else buffers
        if _kernel is not None:
            slots = np.ascontiguousarray(slots, dtype=np.int64)
        out: dict[str, np.ndarray] = {}
        sources, rows_of, dests = [], [], []
        for name, col, offset, steps in self._gather_plan:
            if steps is None:
                rows = slots if offset == 0 else (slots + offset) % cap
            else:
                rows = (slots[:, None] + steps) % cap
            out[name] = dest = buffers.empty(rows.shape + col.shape[1:], col.dtype)
            if rows.ndim > 1:  # a sequence window is copied as B * T whole rows
                rows, dest = rows.reshape(-1), dest.reshape(rows.size, *col.shape[1:])
            if col.dtype.kind in "mM":  # numpy exports no buffer for these: copy as int64
                col, dest = col.view(np.int64), dest.view(np.int64)
            sources.append(col)
            rows_of.append(rows)
            dests.append(dest)
        if _kernel is None:
            for col, rows, dest in zip(sources, rows_of, dests):
                np.take(col, rows, axis=0, out=dest)
            return out
        _kernel.gather(tuple(sources), tuple(rows_of), tuple(dests), GATHER_THREADS)
        return out
