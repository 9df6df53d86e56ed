"""Insertion-order selection: Fifo (oldest first) and Lifo (newest first)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.selectors.base import Selector

NIL = -1
_LOOP_LIMIT = 16  # below this many deletions, unlinking one by one is fastest


class _InsertionOrder(Selector):
    """Doubly linked list of held slots in insertion order (8 bytes per slot).

    Costs: insert O(1) per slot, delete O(1) per slot (large batches are unlinked with
    vectorised pointer jumping), update O(1) (priorities do not affect the order),
    first(k) O(k). An updated item keeps its place: order is by insertion only.
    """

    deterministic = True
    newest_first = False

    def bind(self, capacity: int) -> None:
        self.prev = np.full(capacity, NIL, dtype=np.int32)
        self.next = np.full(capacity, NIL, dtype=np.int32)
        self.head = NIL  # oldest
        self.tail = NIL  # newest
        self.size = 0

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        n = len(slots)
        if n == 0:
            return
        first, last = int(slots[0]), int(slots[-1])
        if n > 1:
            self.next[slots[:-1]] = slots[1:]
            self.prev[slots[1:]] = slots[:-1]
        self.prev[first] = self.tail
        self.next[last] = NIL
        if self.tail == NIL:
            self.head = first
        else:
            self.next[self.tail] = first
        self.tail = last
        self.size += n

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        pass

    def _unlink_one(self, s: int) -> None:
        p, q = int(self.prev[s]), int(self.next[s])
        if p == NIL:
            self.head = q
        else:
            self.next[p] = q
        if q == NIL:
            self.tail = p
        else:
            self.prev[q] = p

    def delete(self, slots: np.ndarray) -> None:
        k = len(slots)
        if k <= _LOOP_LIMIT:
            for s in slots.tolist():
                self._unlink_one(s)
        else:
            self._unlink_many(np.asarray(slots, dtype=np.int64))
        self.size -= k

    def _unlink_many(self, slots: np.ndarray) -> None:
        doomed = np.zeros(len(self.prev), dtype=bool)
        doomed[slots] = True
        p = self.prev[slots].astype(np.int64)
        q = self.next[slots].astype(np.int64)
        # Pointer jumping: follow prev/next through deleted neighbours until a survivor.
        while True:
            jump = (p != NIL) & doomed[np.maximum(p, 0)]
            if not jump.any():
                break
            p[jump] = self.prev[p[jump]]
        while True:
            jump = (q != NIL) & doomed[np.maximum(q, 0)]
            if not jump.any():
                break
            q[jump] = self.next[q[jump]]
        has_p, has_q = p != NIL, q != NIL
        self.next[p[has_p]] = q[has_p]
        self.prev[q[has_q]] = p[has_q]
        if (~has_p).any():
            self.head = int(q[~has_p][0])
        if (~has_q).any():
            self.tail = int(p[~has_q][0])

    def clear(self) -> None:
        self.head = self.tail = NIL
        self.size = 0

    def first(self, k: int) -> np.ndarray:
        k = min(k, self.size)
        out = np.empty(k, dtype=np.int64)
        step = self.prev if self.newest_first else self.next
        s = self.tail if self.newest_first else self.head
        for i in range(k):
            out[i] = s
            s = int(step[s])
        return out

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return np.full(n, self.first(1)[0], dtype=np.int64), np.ones(n)

    def choose_victims(self, k: int, rng: np.random.Generator) -> np.ndarray:
        return self.first(k)

    def min_probability(self) -> float:
        return 1.0

    def state(self) -> dict[str, Any]:
        return {"order": self._oldest_first()}

    def _oldest_first(self) -> np.ndarray:
        out = np.empty(self.size, dtype=np.int64)
        s = self.head
        for i in range(self.size):
            out[i] = s
            s = int(self.next[s])
        return out

    def load_state(self, state: dict[str, Any]) -> None:
        self.clear()
        self.insert(np.asarray(state["order"], dtype=np.int64), np.empty(0))

    def nbytes(self) -> int:
        return self.prev.nbytes + self.next.nbytes


class Fifo(_InsertionOrder):
    """First in, first out: selects the least recently inserted item."""

    name = "fifo"


class Lifo(_InsertionOrder):
    """Last in, first out: selects the most recently inserted item."""

    name = "lifo"
    newest_first = True
