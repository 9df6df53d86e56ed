"""Insertion-order selection: Fifo (oldest first) and Lifo (newest first)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core.selectors.base import OrderedSelector, check_parts, copy_into, touched

NIL = -1
_LOOP_LIMIT = 16  # below this many deletions, unlinking one by one is fastest


class _InsertionOrder(OrderedSelector):
    """Doubly linked list of held slots in insertion order (8 bytes per slot; O(1) per slot)."""

    newest_first = False
    uses_priorities = False

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

    def move(self, old: int, new: int, priority: float) -> None:
        """Relink ``new`` where ``old`` was, so the item keeps its place in the order."""
        if old == new:
            return
        p, q = int(self.prev[old]), int(self.next[old])
        self.prev[new], self.next[new] = p, q
        if p == NIL:
            self.head = new
        else:
            self.next[p] = new
        if q == NIL:
            self.tail = new
        else:
            self.prev[q] = new

    def replace(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        n = len(slots)
        first, last = int(slots[0]), int(slots[-1])
        if first == self.head and (n == 1 or (self.next[slots[:-1]] == slots[1:]).all()):
            # The slots are the oldest items, linked in this order: move the chain whole.
            self._move_head_chain_to_tail(first, last, n)
        else:
            self.delete(slots)
            self.insert(slots, priorities)

    def _move_head_chain_to_tail(self, first: int, last: int, n: int) -> None:
        """Move the chain ``first .. last`` (the ``n`` oldest items) behind the newest."""
        if n == self.size:
            return  # the chain is the whole list: its order does not change
        new_head = int(self.next[last])
        self.prev[new_head] = NIL
        self.head = new_head
        self.next[self.tail] = first
        self.prev[first] = self.tail
        self.next[last] = NIL
        self.tail = last

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
        """Unlink ``k`` distinct held slots with O(log k) vectorised passes."""
        k = len(slots)
        first, last = int(slots[0]), int(slots[-1])
        if (self.next[slots[:-1]] == slots[1:]).all():
            # Given in list order, each the next of the one before: one chain (the usual case).
            before, after = int(self.prev[first]), int(self.next[last])
            self._link(before, after)
            return
        lo, hi = int(slots.min()), int(slots.max())
        if hi - lo + 1 == k:  # distinct slots spanning k values: the range [lo, hi]
            order = None

            def member(x: np.ndarray) -> np.ndarray:
                return (x >= lo) & (x <= hi)

            def index_of(x: np.ndarray) -> np.ndarray:
                return x - lo

            sorted_slots = np.arange(lo, hi + 1, dtype=np.int64)
        else:
            sorted_slots = np.sort(slots)
            order = sorted_slots

            def member(x: np.ndarray) -> np.ndarray:
                pos = np.minimum(np.searchsorted(order, x), k - 1)
                return order[pos] == x

            def index_of(x: np.ndarray) -> np.ndarray:
                return np.searchsorted(order, x)

        p = self.prev[sorted_slots].astype(np.int64)
        q = self.next[sorted_slots].astype(np.int64)
        p_in, q_in = member(p), member(q)
        if k - int(p_in.sum()) == 1:  # one chain: link its two outside neighbours
            before = int(p[~p_in][0])
            after = int(q[~q_in][0])
        else:
            # Pointer doubling: each pass halves the distance to the chain's survivors.
            while p_in.any():
                p = np.where(p_in, p[index_of(np.where(p_in, p, lo))], p)
                p_in = member(p)
            while q_in.any():
                q = np.where(q_in, q[index_of(np.where(q_in, q, lo))], q)
                q_in = member(q)
            has_p, has_q = p != NIL, q != NIL
            self.next[p[has_p]] = q[has_p]
            self.prev[q[has_q]] = p[has_q]
            if (~has_p).any():
                self.head = int(q[~has_p][0])
            if (~has_q).any():
                self.tail = int(p[~has_q][0])
            return
        self._link(before, after)

    def _link(self, before: int, after: int) -> None:
        """Link ``before`` to ``after`` (either ``NIL``: the list's end) across a chain."""
        if before == NIL:
            self.head = after
        else:
            self.next[before] = after
        if after == NIL:
            self.tail = before
        else:
            self.prev[after] = before

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

    def state(self, into: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """The links as they are (copies)."""
        return {
            "prev": copy_into(self.prev, into, "prev"),
            "next": copy_into(self.next, into, "next"),
            "head": self.head,
            "tail": self.tail,
            "size": self.size,
        }

    def state_buffers(self) -> dict[str, np.ndarray]:
        links = (("prev", self.prev), ("next", self.next))
        return {name: touched(a.shape, a.dtype) for name, a in links}

    def rebuild_order(self) -> np.ndarray:
        """Oldest first (a walk along the links)."""
        return self._oldest_first()

    def _oldest_first(self) -> np.ndarray:
        out = np.empty(self.size, dtype=np.int64)
        s = self.head
        for i in range(self.size):
            out[i] = s
            s = int(self.next[s])
        return out

    def check_state(self, state: dict[str, Any]) -> None:
        check_parts(self, state, {"prev": self.prev.shape, "next": self.next.shape})

    def load_state(self, state: dict[str, Any]) -> None:
        self.prev[:] = state["prev"]
        self.next[:] = state["next"]
        self.head, self.tail = int(state["head"]), int(state["tail"])
        self.size = int(state["size"])

    def nbytes(self) -> int:
        return self.prev.nbytes + self.next.nbytes


class Fifo(_InsertionOrder):
    """First in, first out: selects the least recently inserted item."""

    name = "fifo"


class Lifo(_InsertionOrder):
    """Last in, first out: selects the most recently inserted item."""

    name = "lifo"
    newest_first = True
