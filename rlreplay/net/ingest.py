"""Server side of remote writers: apply each chunk of steps and items whole, or not at all.

A remote writer sends its steps in chunks together with the items it created over them.
Each item names its anchor by *stream index* (the position of the step in everything this
writer appended, counted from 0). A :class:`WriterSession` maps stream indices to store
step ids and, like :class:`rlreplay.TrajectoryWriter`, holds a retention of the store's
overwrite protocol (:mod:`rlreplay.core.overwrite`): the newest ``history`` steps of the
current episode are never overwritten by other writers (the protocol copies them to the
store's head first), and each chunk's steps continue them contiguously.

A chunk is all or nothing. :meth:`~rlreplay.net.chunk_checks.Chunk.parse` checks every
field of the request against the session (shapes and dtypes of the steps, each item's
table, anchor, extent and priority, the order of chunks) before anything changes.
:meth:`WriterSession.apply` then plans the whole chunk under the store's lock (the context
to copy, the store id of every item) and changes something only when every table's rate
limiter admits all of the chunk's items and the store has room for all of its steps
*now*; otherwise it changes
nothing and the server parks the chunk, and a chunk whose deadline passes leaves nothing
behind. So a writer knows after each reply exactly what is stored, and may send a chunk
that failed again. Chunks carry a sequence number: a chunk sent twice (a retry after a
lost reply) is answered with the keys of its first application and not applied again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import pairwise

import numpy as np

from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import ClosedError, InvalidArgumentError, describe
from rlreplay.net.chunk_checks import Chunk

KEPT_REPLIES = 64  # replies a session keeps for chunks sent again


def store_has_room(store: StepStore, n: int) -> bool:
    """Whether ``n`` steps can be appended now without waiting for a queue's items (lock
    held): the store's overwrite protocol plans the append without changing anything."""
    protocol = getattr(store, "overwrite", None)
    if protocol is not None:
        return protocol.has_room(n)
    return store.overwrite.has_room(min(n, store.capacity))


def admits(table: Table, m: int) -> bool:
    """Whether ``table``'s rate limiter admits a chunk's ``m`` items at once now (lock
    held). Writers keep ``m`` within the table's ``insert_window`` (see
    :func:`rlreplay.net.handlers.insert_window`), so a chunk never waits for samples that
    cannot come."""
    return table.rate_limiter.can_insert(m, table.size)


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
        self.variable = np.array([bool(t.layout.variable) for t in tables])
        self.next_seq = 0  # sequence number of the next chunk to apply
        self.applied = 0  # stream index one past the last applied chunk's steps
        self.episode_start = 0  # stream index where the current episode began
        with self.store.mutex:
            # The newest ``history`` steps of the current episode (stream indices
            # ``applied - count .. applied - 1``), which later items may reach: the
            # store's overwrite protocol never overwrites them (when an append would, it
            # copies them to the store's head first), and this writer's next append
            # continues them.
            self.retention = self.store.overwrite.retain(history)
        # Per table: anchors (stream indices) of items created over recent steps, so a
        # chunk that repeats an earlier chunk's anchor is refused before it changes
        # anything.
        self.recent: list[np.ndarray] = [np.zeros(0, np.int64) for _ in tables]
        self.replies: OrderedDict[int, np.ndarray] = OrderedDict()
        self.pending: deque = deque()  # WriteJobs of this writer, oldest first

    # ---------------------------------------------------------------- chunks
    def parse(self, header: dict, arrays: dict) -> Chunk:
        """:meth:`Chunk.parse` for this session."""
        return Chunk.parse(self, header, arrays)

    def replayed(self, header: dict) -> np.ndarray | None:
        """Keys of the chunk ``header`` numbers if it was applied already (the writer sent
        it again after losing the reply); None otherwise. Checked before the chunk is
        parsed: checks against the stream as it stands now would not hold for it."""
        seq = header.get("seq")
        if seq is not None and seq < self.next_seq:
            return self.replies.get(seq)
        return None

    def check_next(self, chunk: Chunk) -> None:
        """Check that ``chunk`` continues this writer's stream of applied chunks.

        Raises:
            InvalidArgumentError: if it does not (an earlier chunk of this writer was not
                applied, or this one was applied too long ago to be answered again);
                nothing of it is applied.
        """
        if chunk.seq != self.next_seq or (chunk.first != self.applied and not chunk.restart):
            raise InvalidArgumentError(
                f"writer chunk {chunk.seq} (stream steps from {chunk.first}) was not applied: "
                f"this writer's stream stands at chunk {self.next_seq}, step {self.applied} "
                "(an earlier chunk was not applied; the writer sends it again)"
            )

    def apply(self, chunk: Chunk) -> np.ndarray | None:
        """Apply the whole chunk now if every table admits its items and the store has
        room for its steps; returns the items' keys in creation order, or None (nothing
        changed) when something must wait.

        Raises:
            InvalidArgumentError: if an item needs context steps the store no longer
                holds, or repeats an anchor an earlier chunk used; nothing changes.
            ClosedError: if one of the tables was closed.
        """
        store = self.store
        with store.lock:
            for t, m in enumerate(chunk.counts.tolist()):
                table = self.tables[t]
                if m and getattr(table, "_closed", False):
                    raise ClosedError(f"table {table.name!r} is closed")
                if m and not admits(table, m):
                    return None
            segments, keep = self._segments(chunk)
            own = self.retention
            if chunk.n and not store.overwrite.has_room(chunk.n, own=own, keep=keep):
                return None
            # Every item must lie in the steps this chunk appends or the retained ones it
            # continues (checked with stand-in ids: nothing is appended yet).
            _store_ids(self._runs(segments, keep, None), chunk.anchor, chunk.need)
            self._check_repeats(chunk)
            # Checked and admitted: nothing below fails for the chunk's own reasons.
            ids = _store_ids(self._append(chunk, segments, keep), chunk.anchor, chunk.need)
            if len(ids) and ids.min() < store.oldest_id:
                # Only when an earlier episode of this same chunk was overwritten by the
                # copies its later appends made for other writers (a store far too small).
                raise InvalidArgumentError(
                    "the chunk's items reach steps that copies for other writers overwrote "
                    "while it was appended; its steps are stored, its items are not (enlarge "
                    "the store)"
                )
            keys = self._create(chunk, ids)
        if self._new_episode(chunk):
            self.episode_start = chunk.first
        if chunk.starts:
            self.episode_start = chunk.starts[-1]
        self.applied = chunk.first + chunk.n
        self.next_seq = chunk.seq + 1
        self.replies[chunk.seq] = keys
        while len(self.replies) > KEPT_REPLIES:
            self.replies.popitem(last=False)
        return keys

    def close(self) -> None:
        """Let the retained steps go for good (the writer closed)."""
        with self.store.mutex:
            self.store.overwrite.forget(self.retention)

    def release(self) -> None:
        """Let the retained steps go (the writer was silent too long, or the store needs
        room for other writers): the next chunk's items cannot reach back before it."""
        with self.store.mutex:
            self.retention.release()

    def blocked_by(self, chunk: Chunk) -> Table:
        """The table whose rate limiter keeps ``chunk`` waiting (the first table when it
        waits for room in the store), for blocked-time accounting."""
        for t, m in enumerate(chunk.counts.tolist()):
            table = self.tables[t]
            if m and not admits(table, m):
                return table
        return self.tables[0]

    # --------------------------------------------------------------- planning
    def _new_episode(self, chunk: Chunk) -> bool:
        """Whether ``chunk`` begins a new episode at its first step."""
        return (
            chunk.restart
            or chunk.first != self.applied
            or bool(chunk.starts and chunk.starts[0] == chunk.first)
        )

    def _segments(self, chunk: Chunk) -> tuple[list[tuple[int, int]], int]:
        """The chunk's steps split at episode starts (``(a, b)`` stream ranges, none
        empty), and how many retained steps the first one continues."""
        bounds = [chunk.first, *[s for s in chunk.starts if s > chunk.first], chunk.first + chunk.n]
        segments = [(a, b) for a, b in pairwise(bounds) if b > a]
        keep = 0 if self._new_episode(chunk) else self.retention.count
        return segments, keep

    def _runs(self, segments: list, keep: int, firsts: list | None) -> list:
        """Runs ``(stream start, stream end, store id of the start)`` holding the retained
        steps the chunk continues and each segment, given each segment's first store id
        (``firsts``; None: stand-in ids, to check that items lie in some run)."""
        runs = []
        if keep and not segments:  # no new steps: items lie in the retained ones
            r = self.retention
            runs.append((self.applied - keep, self.applied, r.first))
        for j, (a, b) in enumerate(segments):
            first = 0 if firsts is None else firsts[j]
            lo = a - keep if j == 0 else a  # the retained steps end right before it
            runs.append((lo, b, first - (a - lo)))
        return runs

    def _check_repeats(self, chunk: Chunk) -> None:
        low = chunk.first - self.history
        for t in range(len(self.tables)):
            recent = self.recent[t] = self.recent[t][self.recent[t] >= low]
            mine = chunk.anchor[chunk.table == t] if len(recent) and chunk.counts[t] else ()
            if len(mine) and np.isin(mine, recent).any():
                raise InvalidArgumentError(
                    f"writer chunk creates an item in table {self.tables[t].name!r} at an "
                    "anchor an earlier chunk already used; a table holds at most one item "
                    "per anchor step"
                )

    # --------------------------------------------------------------- applying
    def _append(self, chunk: Chunk, segments: list, keep: int) -> list:
        """Append each segment right after the retained steps it continues (the store's
        overwrite protocol copies them to its head first when other steps came between);
        returns the runs with the store ids the steps got."""
        store, own = self.store, self.retention
        firsts = []
        for j, (a, b) in enumerate(segments):
            k = keep if j == 0 else 0
            if not k:
                own.release()  # a new episode: earlier steps are no longer reachable
            if store.overwrite.make_room(b - a, own=own, keep=k) is None:
                # Room was checked for the whole chunk; only a later episode of it can
                # meet a queue the first check did not see. Its steps are not written.
                raise InvalidArgumentError(
                    "the chunk's later episode found the store's rows held by a queue's "
                    "items; send episodes in separate chunks, or enlarge the store"
                )
            data = {p: arr[a - chunk.first : b - chunk.first] for p, arr in chunk.steps.items()}
            first = store._write_locked(data, b - a)
            own.extend(first, b - a)
            firsts.append(first)
        if not segments and not keep:
            own.release()
        return self._runs(segments, keep, firsts)

    def _create(self, chunk: Chunk, ids: np.ndarray) -> np.ndarray:
        """Create the chunk's items, one batch per table; keys in creation order."""
        keys = np.zeros(len(ids), np.int64)
        for t, m in enumerate(chunk.counts.tolist()):
            if not m:
                continue
            table = self.tables[t]
            mine = np.flatnonzero(chunk.table == t)
            length = chunk.length[mine]
            lengths = None
            if (length > 0).any():
                lengths = np.where(length > 0, length, table.layout.span)
            prios = _priorities(table, chunk.priority[mine])
            keys[mine] = table.create_items(ids[mine], prios, lengths=lengths)
            self.recent[t] = np.concatenate([self.recent[t], chunk.anchor[mine]])
        return keys


def _store_ids(runs: list, anchors: np.ndarray, needs: np.ndarray) -> np.ndarray:
    """Store ids of item anchors: each from the newest run holding its whole window.

    Raises:
        InvalidArgumentError: if no run holds an item's window.
    """
    ids = np.empty(len(anchors), dtype=np.int64)
    todo = np.ones(len(anchors), dtype=bool)
    for s0, s1, d0 in reversed(runs):
        if not todo.any():
            break
        hit = todo & (anchors >= s0) & (needs <= s1)
        ids[hit] = d0 + (anchors[hit] - s0)
        todo &= ~hit
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
