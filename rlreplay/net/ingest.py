"""Server side of remote writers: apply a chunk of steps and item creations in order.

A remote writer sends its steps in chunks together with the items it created over them.
Each item names its anchor by *stream index* (the position of the step in everything this
writer appended, counted from 0). A :class:`WriterSession` maps stream indices to store
step ids and keeps each episode contiguous in the store: when other writers appended in
between, the retained steps of the current episode (at most ``history - 1``) are copied
to the end of the store first, exactly as :class:`rlreplay.TrajectoryWriter` does.

A chunk never waits inside a lock. :meth:`WriterSession.advance` does as much as the rate
limiters and the store allow *now* and reports whether the chunk is finished; the server
parks unfinished chunks and calls ``advance`` again when a table changes. Steps are
appended only when the next items need them, so a parked chunk holds no appended steps
without their items (except the context every later item needs anyway).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, ProtocolError, describe


def insertable(table: Table, want: int) -> int:
    """Largest ``n <= want`` the table's limiter admits now (lock held by the caller)."""
    limiter, size = table.rate_limiter, table.size
    if limiter.can_insert(want, size):
        return want
    lo, hi = 0, want  # can_insert(lo) assumed true for lo == 0, false for hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if limiter.can_insert(mid, size):
            lo = mid
        else:
            hi = mid
    return lo


def store_has_room(store: StepStore, n: int) -> bool:
    """Whether ``n`` steps can be appended without waiting for a queue table (lock held)."""
    if store.next_id + n <= store.capacity:
        return True
    start = store.next_id % store.capacity
    return not any(t._blocks_overwrite(start, min(n, store.capacity)) for t in store._tables)


class WriterSession:
    """One remote writer's stream state on the server.

    Args:
        tables: the writer's tables (sharing one store), in the order its chunks index them.
        history: steps an item may reach back.
    """

    def __init__(self, tables: list[Table], history: int):
        self.tables = tables
        self.store = tables[0].store
        self.history = history
        self.spans = np.array([t.layout.span for t in tables], dtype=np.int64)
        self.next_stream = 0  # stream index of the next step to arrive
        self.appended = 0  # stream steps appended to the store so far
        self.episode_start = 0  # stream index where the current episode began
        # Contiguous runs of this episode in the store: (stream start, stream end, store id
        # of the start). A step copied as context lives in two runs; an item uses the newest
        # run that holds its whole window.
        self.runs: list[tuple[int, int, int]] = []
        self.chunk: dict | None = None
        self.pending: deque = deque()  # WriteJobs of this writer, oldest first

    # ---------------------------------------------------------------- chunks
    def begin(self, header: dict, arrays: dict[str, np.ndarray]) -> None:
        """Take a new chunk (validated here; raises ProtocolError/InvalidArgumentError)."""
        first = header.get("first")
        if not isinstance(first, int):
            raise ProtocolError(f"writer chunk has first={first!r}, not a stream index")
        if first != self.next_stream or self.appended != first:
            # An earlier chunk was dropped or failed part-way: start a fresh episode here.
            self.appended = self.episode_start = first
            self.runs = []
        sig = self.store.signature
        steps = {p: arrays.get("data/" + p) for p in sig.paths}
        n = int(header.get("n", 0))
        for path, arr in steps.items():
            spec = sig.fields[path]
            if arr is None or arr.shape != (n, *spec.shape) or arr.dtype != spec.dtype:
                raise ProtocolError(f"writer chunk field {path!r} does not match the signature")
        if n > self.store.capacity - self.history:
            raise InvalidArgumentError(
                f"a chunk of {n} steps does not fit a store of {self.store.capacity} steps "
                f"with history {self.history}; send smaller chunks"
            )
        table_idx = arrays.get("item_table", np.zeros(0, np.int32)).astype(np.int64)
        anchors = arrays.get("item_anchor", np.zeros(0, np.int64)).astype(np.int64)
        prios = arrays.get("item_priority", np.zeros(0)).astype(np.float64)
        if not (len(table_idx) == len(anchors) == len(prios)):
            raise ProtocolError("writer chunk item arrays differ in length")
        if len(table_idx) and (table_idx.min() < 0 or table_idx.max() >= len(self.tables)):
            raise ProtocolError("writer chunk names a table index it does not have")
        lengths = arrays.get("item_length")
        spans = self.spans[table_idx]
        if lengths is not None:
            lengths = lengths.astype(np.int64)
            if (
                len(lengths) != len(anchors)
                or (lengths == 0).any()
                or (lengths > self.history).any()
            ):
                raise ProtocolError("writer chunk item lengths are malformed")
            spans = np.where(lengths > 0, lengths, spans)
        ends = [int(e) for e in header.get("episode_starts", [])]
        self.chunk = {
            "first": first,
            "n": n,
            "steps": steps,
            "table": table_idx,
            "anchor": anchors,
            "prio": prios,
            "need": anchors + spans if len(anchors) else anchors,
            "length": lengths,
            "episode_starts": ends,
            "items_done": 0,
            "keys": [],
        }
        self.next_stream = first + n
        # Items of this chunk reach back at most `history` steps before its first step.
        self.runs = [r for r in self.runs if r[1] > first - self.history]

    def advance(self) -> bool:
        """Apply as much of the current chunk as possible now; True when it is finished.

        Raises:
            InvalidArgumentError: if an item reaches steps no longer stored (the store is
                too small for the traffic) or duplicates an anchor; the chunk is dropped.
        """
        c = self.chunk
        assert c is not None
        total = len(c["anchor"])
        with self.store.lock:
            while c["items_done"] < total:
                i = c["items_done"]
                t = int(c["table"][i])
                other = np.flatnonzero(c["table"][i:] != t)
                run_end = total if len(other) == 0 else i + int(other[0])
                table = self.tables[t]
                m = insertable(table, run_end - i)
                if m == 0:
                    return False
                need = int(c["need"][i : i + m].max())
                if not self._append_until(need):
                    return False
                anchors = self._store_ids(c["anchor"][i : i + m], c["need"][i : i + m])
                prios = c["prio"][i : i + m]
                c["items_done"] = i + m  # advance first: a failing create drops the chunk
                lengths = c["length"]
                if lengths is not None and (lengths[i : i + m] > 0).any():
                    span = table.layout.span
                    run = np.where(lengths[i : i + m] > 0, lengths[i : i + m], span)
                    keys = table.create_items(anchors, _priorities(table, prios), lengths=run)
                else:
                    keys = table.create_items(anchors, _priorities(table, prios))
                c["keys"].append(keys)
            return self._append_until(c["first"] + c["n"])

    def finish(self) -> np.ndarray:
        """Keys of the finished chunk's items, in creation order; forgets the chunk."""
        c, self.chunk = self.chunk, None
        return np.concatenate(c["keys"]) if c and c["keys"] else np.zeros(0, np.int64)

    @property
    def items_done(self) -> int:
        return 0 if self.chunk is None else self.chunk["items_done"]

    # --------------------------------------------------------------- appending
    def _append_until(self, end: int) -> bool:
        """Append stream steps up to ``end`` (exclusive), split at episode starts."""
        c = self.chunk
        while self.appended < end:
            seg_end = end
            for s in c["episode_starts"]:
                if self.appended < s < seg_end:
                    seg_end = s
            if self.appended in c["episode_starts"]:
                self.episode_start = self.appended
            if not self._append_segment(self.appended, seg_end):
                return False
        return True

    def _append_segment(self, a: int, b: int) -> bool:
        """Append stream steps ``[a, b)`` of one episode, keeping the episode contiguous."""
        store = self.store
        n = b - a
        last = self.runs[-1] if self.runs else None
        extends = last is not None and last[1] == a and last[2] + (a - last[0]) == store.next_id
        lo = a
        if last is not None and not extends and last[1] == a:
            lo = max(self.episode_start, a - (self.history - 1), last[0])
        if not store_has_room(store, n + (a - lo)):
            return False
        if lo < a:
            ids = last[2] + np.arange(lo - last[0], a - last[0])
            if ids.min() >= store.oldest_id:
                store._append_locked(store.read(ids), a - lo)
            else:
                lo = a  # the context was overwritten: later items cannot reach it
        rel = a - self.chunk["first"]
        data = {p: arr[rel : rel + n] for p, arr in self.chunk["steps"].items()}
        first_new = store._append_locked(data, n)
        if extends:
            self.runs[-1] = (last[0], b, last[2])
        else:
            self.runs.append((lo, b, first_new - (a - lo)))
        self.appended = b
        return True

    def _store_ids(self, anchors: np.ndarray, needs: np.ndarray) -> np.ndarray:
        """Store ids of item anchors: each from the newest run holding its whole window.

        Raises:
            InvalidArgumentError: if no run holds an item's window.
        """
        ids = np.empty(len(anchors), dtype=np.int64)
        todo = np.ones(len(anchors), dtype=bool)
        for s0, s1, d0 in reversed(self.runs):
            hit = todo & (anchors >= s0) & (needs <= s1)
            ids[hit] = d0 + (anchors[hit] - s0)
            todo &= ~hit
            if not todo.any():
                return ids
        if todo.any():
            raise InvalidArgumentError(
                f"items anchored at stream steps {describe(anchors[todo][:4].tolist())} reach "
                "steps no longer retained for their episode; create items over at most "
                "`history` recent steps (and keep the store larger than the traffic in flight)"
            )
        return ids


def _priorities(table: Table, prios: np.ndarray) -> np.ndarray | None:
    missing = np.isnan(prios)
    if missing.all():
        return None
    if missing.any():
        prios = prios.copy()
        fill = table.default_priority
        prios[missing] = table._max_priority if fill is None else fill
    return prios
