"""Priority-order selection: MinHeap (lowest priority first) and MaxHeap (highest first).

Ties go to the least recently inserted or updated item.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core.selectors.base import OrderedSelector, check_parts, copy_into, touched
from rlreplay.core.selectors.sum_tree import FANOUT

EMPTY = -1
_NO_SEQ = np.iinfo(np.int64).max


class _Heap(OrderedSelector):
    """Tournament tree of winner slots over ``(key, seq)``, 16-ary, about 17 bytes per slot."""
    sign = 1.0  # MaxHeap stores -priority so that the tree always picks the minimum

    def bind(self, capacity: int) -> None:
        self.capacity = capacity
        self.key = np.full(capacity, np.inf)
        self.seq = np.full(capacity, _NO_SEQ, dtype=np.int64)
        self.counter = 0
        self.size = 0
        self.levels: list[np.ndarray] = []
        n = capacity
        while True:
            n = -(-n // FANOUT)
            self.levels.append(np.full(-(-n // FANOUT) * FANOUT, EMPTY, dtype=np.int64))
            if n == 1:
                break

    def _winners(self, children: np.ndarray) -> np.ndarray:
        valid = children >= 0
        safe = np.where(valid, children, 0)
        keys = np.where(valid, self.key[safe], np.inf)
        best = keys.min(axis=1)
        cand = valid & (keys == best[:, None])
        seqs = np.where(cand, self.seq[safe], _NO_SEQ)
        j = np.argmin(seqs, axis=1)
        rows = np.arange(len(children))
        return np.where(cand.any(axis=1), children[rows, j], EMPTY)

    def _refresh(self, slots: np.ndarray) -> None:
        parents = np.unique(np.asarray(slots, dtype=np.int64) // FANOUT)
        level_below = None
        for level in self.levels:
            if level_below is None:
                base = parents[:, None] * FANOUT + np.arange(FANOUT)
                children = np.where(base < self.capacity, base, EMPTY)
                held = children >= 0
                held[held] = self.seq[children[held]] != _NO_SEQ
                children = np.where(held, children, EMPTY)
            else:
                children = level_below.reshape(-1, FANOUT)[parents]
            level[parents] = self._winners(children)
            level_below = level
            parents = np.unique(parents // FANOUT)

    def _stamp(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        n = len(slots)
        self.key[slots] = self.sign * np.asarray(priorities, dtype=np.float64)
        self.seq[slots] = np.arange(self.counter, self.counter + n)
        self.counter += n

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self._stamp(slots, priorities)
        self.size += len(slots)
        self._refresh(slots)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self._stamp(slots, priorities)
        self._refresh(slots)

    def delete(self, slots: np.ndarray) -> None:
        self.key[slots] = np.inf
        self.seq[slots] = _NO_SEQ
        self.size -= len(slots)
        self._refresh(slots)

    def clear(self) -> None:
        self.key.fill(np.inf)
        self.seq.fill(_NO_SEQ)
        for level in self.levels:
            level.fill(EMPTY)
        self.size = 0

    def first(self, k: int) -> np.ndarray:
        """The ``k`` first held slots in ``(key, seq)`` order."""
        k = min(int(k), self.size)
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        if k == 1:
            return np.array([self.levels[-1][0]], dtype=np.int64)
        spread = np.arange(FANOUT, dtype=np.int64)
        nodes = np.zeros(1, dtype=np.int64)  # the root, in the top level
        for depth in range(len(self.levels) - 1, -1, -1):
            children = (nodes[:, None] * FANOUT + spread).ravel()
            if depth == 0:  # the children are slots
                children = children[children < self.capacity]
                winners = children = children[self.seq[children] != _NO_SEQ]
            else:
                winners = self.levels[depth - 1][children]
                held = winners != EMPTY
                children, winners = children[held], winners[held]
            nodes = children[self._best(winners, k)]
        return nodes[np.lexsort((self.seq[nodes], self.key[nodes]))]

    def _best(self, slots: np.ndarray, k: int) -> np.ndarray:
        """Indices of the ``k`` first of ``slots`` in ``(key, seq)`` order, unordered."""
        if len(slots) <= k:
            return np.arange(len(slots))
        keys = self.key[slots]
        kth = np.partition(keys, k - 1)[k - 1]
        below = np.flatnonzero(keys < kth)
        ties = np.flatnonzero(keys == kth)
        if len(below) + len(ties) > k:  # the oldest of the tied slots go first
            ties = ties[np.argsort(self.seq[slots[ties]])[: k - len(below)]]
        return np.concatenate([below, ties])

    def state(self, into: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """Keys and stamps per slot (copies)."""
        return {
            "key": copy_into(self.key, into, "key"),
            "seq": copy_into(self.seq, into, "seq"),
            "counter": self.counter,
            "size": self.size,
        }

    def state_buffers(self) -> dict[str, np.ndarray]:
        arrays = (("key", self.key), ("seq", self.seq))
        return {name: touched(a.shape, a.dtype) for name, a in arrays}

    def rebuild_order(self) -> np.ndarray:
        """Held slots by stamp, so re-insertion keeps their tie order."""
        held = np.flatnonzero(self.seq != _NO_SEQ)
        return held[np.argsort(self.seq[held], kind="stable")]

    def check_state(self, state: dict[str, Any]) -> None:
        check_parts(self, state, {"key": self.key.shape, "seq": self.seq.shape})

    def load_state(self, state: dict[str, Any]) -> None:
        self.key[:] = state["key"]
        self.seq[:] = state["seq"]
        self.counter = int(state["counter"])
        self.size = int(state["size"])
        for level in self.levels:
            level.fill(EMPTY)
        self._refresh(np.arange(self.capacity))

    def nbytes(self) -> int:
        return self.key.nbytes + self.seq.nbytes + sum(lv.nbytes for lv in self.levels)


class MinHeap(_Heap):
    """Selects the item with the lowest priority."""

    name = "min_heap"


class MaxHeap(_Heap):
    """Selects the item with the highest priority."""

    name = "max_heap"
    sign = -1.0
