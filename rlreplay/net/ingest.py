"""Server side of remote writers: apply each chunk of steps and items whole, or not at all.

A remote writer sends its steps in chunks together with the items it created over them.
Each item names its anchor by *stream index* (the position of the step in everything this
writer appended, counted from 0). A :class:`WriterSession` maps stream indices to store
step ids and keeps each episode contiguous in the store: when other writers appended in
between, the retained steps of the current episode (at most ``history - 1``) are copied
to the end of the store first, exactly as :class:`rlreplay.TrajectoryWriter` does.

A chunk is all or nothing. :meth:`Chunk.parse` checks every field of the request against
the session (shapes and dtypes of the steps, each item's table, anchor, extent and
priority, the order of chunks) before anything changes. :meth:`WriterSession.apply` then
plans the whole chunk under the store's lock (the context to copy, the store id of every
item) and changes something only when every table's rate limiter admits all of the
chunk's items and the store has room for all of its steps *now*; otherwise it changes
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
from rlreplay.errors import ClosedError, InvalidArgumentError, ProtocolError, describe

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


class Chunk:
    """One ``write`` request, checked against its session (nothing changed by parsing).

    Attributes:
        seq: the chunk's sequence number in its writer's stream of chunks.
        first, n: stream index of its first step, and its number of steps.
        steps: field path -> ``[n, ...]`` array in the store's dtype.
        table, anchor, need, priority, length: per item, in creation order: table index,
            anchor stream index, stream index one past its last step, priority (NaN: the
            table's default) and extent (``-1``: the layout's span).
        starts: stream indices in ``[first, first + n)`` where an episode begins.
        restart: the writer dropped earlier chunks; a new episode begins at ``first``.
    """

    @classmethod
    def parse(cls, session: WriterSession, header: dict, arrays: dict) -> Chunk:
        """Check a ``write`` request (header fields already type-checked by the schema).

        Raises:
            ProtocolError: for steps that do not match the signature, item arrays of
                different lengths or missing, or episode starts outside the chunk.
            InvalidArgumentError: for items whose table, anchor, extent or priority is
                invalid, or more steps than the store can take with the writer's history.
            DeadlockError: for more items of one table than its rate limiter could ever
                admit at once.
        """
        c = cls()
        c.first, c.n = header["first"], header["n"]
        seq = header.get("seq")
        c.seq = session.next_seq if seq is None else seq  # older clients send no seq
        c.restart = bool(header.get("restart")) or (seq is None and c.first != session.applied)
        store = session.store
        if c.n > store.capacity - session.history:
            raise InvalidArgumentError(
                f"a chunk of {c.n} steps does not fit a store of {store.capacity} steps "
                f"with history {session.history}; send smaller chunks"
            )
        sig = store.signature
        c.steps = {}
        for path, spec in sig.fields.items():
            arr = arrays.get("data/" + path)
            if arr is None or arr.shape != (c.n, *spec.shape) or arr.dtype != spec.dtype:
                got = None if arr is None else f"{arr.dtype}{list(arr.shape)}"
                raise ProtocolError(
                    f"writer chunk field {path!r} is {got}; the signature needs "
                    f"{spec.dtype}{[c.n, *spec.shape]}"
                )
            c.steps[path] = arr
        extra = [k for k in arrays if k.startswith("data/") and k[5:] not in c.steps]
        if extra:
            raise ProtocolError(f"writer chunk carries fields {extra} not in the signature")
        starts = sorted(set(header.get("episode_starts") or ()))
        if starts and (starts[0] < c.first or starts[-1] >= c.first + max(c.n, 1)):
            raise ProtocolError(
                f"episode_starts={describe(starts)} must lie in the chunk's steps "
                f"[{c.first}, {c.first + c.n})"
            )
        c.starts = starts
        c._parse_items(session, arrays)
        return c

    def _parse_items(self, session: WriterSession, arrays: dict) -> None:
        names = ("item_table", "item_anchor", "item_priority")
        given = [arrays.get(k) for k in names]
        if all(a is None for a in given):
            given = [np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)]
        elif any(a is None for a in given):
            raise ProtocolError(f"writer chunk items need all of {names}")
        lengths = arrays.get("item_length")
        k = len(given[0])
        if any(len(a) != k for a in given) or (lengths is not None and len(lengths) != k):
            raise ProtocolError("writer chunk item arrays differ in length")
        for a, name in ((given[0], "item_table"), (given[1], "item_anchor"), (lengths, "")):
            if a is not None and a.dtype.kind == "u" and k and a.max() >= 2**62:
                raise InvalidArgumentError(f"{name or 'item_length'} values exceed 2**62")
        table = given[0].astype(np.int64)
        anchor = given[1].astype(np.int64)
        prio = given[2].astype(np.float64)
        if k and (table.min() < 0 or table.max() >= len(session.tables)):
            raise InvalidArgumentError(
                f"writer chunk names table index {describe(sorted(set(table.tolist()))[:8])}; "
                f"its writer has {len(session.tables)} tables"
            )
        spans = session.spans[table]
        length = np.full(k, -1, np.int64) if lengths is None else lengths.astype(np.int64)
        given_len = length != -1
        if given_len.any():
            variable = session.variable[table]
            bad = given_len & (~variable | (length < 1) | (length > spans))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise InvalidArgumentError(
                    f"item length {int(length[i])} for table "
                    f"{session.tables[int(table[i])].name!r}: lengths must lie in [1, span="
                    f"{int(spans[i])}] and only layouts with per-item extents take them"
                )
        extent = np.where(given_len, length, spans)
        bad_prio = ~(np.isnan(prio) | (np.isfinite(prio) & (prio >= 0)))
        if bad_prio.any():
            raise InvalidArgumentError(
                f"item priorities {describe(prio[bad_prio][:4].tolist())} must be finite and "
                ">= 0 (NaN: the table's default)"
            )
        # Every item lies within the steps its writer has sent up to this chunk's end, in
        # one episode, and no further back than the writer's history.
        end = self.first + self.n
        new_episode = self.restart or (self.starts and self.starts[0] == self.first)
        floor = self.first if new_episode else session.episode_start
        need = anchor + extent
        low = max(floor, self.first - session.history)
        bad = (anchor < low) | (need > end)
        if self.starts:
            # an episode start strictly inside an item's window splits it
            starts = np.asarray(self.starts, np.int64)
            inside = np.searchsorted(starts, anchor, "right") < np.searchsorted(starts, need)
            bad |= inside
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidArgumentError(
                f"item anchored at stream step {int(anchor[i])} spanning {int(extent[i])} "
                f"steps reaches outside this writer's steps [{low}, {end}) of one episode "
                f"(history={session.history}); create items only over steps already appended"
            )
        if k:
            pairs = table * (2**62) + anchor  # unique per (table, anchor); anchors < 2**62
            if len(np.unique(pairs)) != k:
                raise InvalidArgumentError(
                    "writer chunk creates two items at the same anchor in one table; a "
                    "table holds at most one item per anchor step"
                )
        counts = np.bincount(table, minlength=len(session.tables))
        for t, m in enumerate(counts.tolist()):
            tab = session.tables[t]
            if m > tab.max_size:
                raise InvalidArgumentError(
                    f"writer chunk creates {m} items in table {tab.name!r}, more than its "
                    f"max_size={tab.max_size}; send smaller chunks"
                )
            if m:
                tab.rate_limiter.check_insert_batch(m)
        self.table, self.anchor, self.need = table, anchor, need
        self.priority, self.length = prio, np.where(given_len, length, -1)
        self.counts = counts


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
        # Contiguous runs of this writer's recent steps in the store: (stream start, stream
        # end, store id of the start). A step copied as context lives in two runs; an item
        # uses the newest run that holds its whole window.
        self.runs: list[tuple[int, int, int]] = []
        # Per table: (anchor stream index, store id) of items created over recent steps,
        # so a chunk that repeats an earlier chunk's anchor is refused before it changes
        # anything.
        self.recent: list[np.ndarray] = [np.zeros((0, 2), np.int64) for _ in tables]
        self.replies: OrderedDict[int, np.ndarray] = OrderedDict()
        self.pending: deque = deque()  # WriteJobs of this writer, oldest first

    # ---------------------------------------------------------------- chunks
    def parse(self, header: dict, arrays: dict) -> Chunk:
        """:meth:`Chunk.parse` for this session."""
        return Chunk.parse(self, header, arrays)

    def settled(self, chunk: Chunk) -> np.ndarray | None:
        """Keys of ``chunk`` if it was applied already (sent again); None if it is next.

        Raises:
            InvalidArgumentError: if the chunk is neither next nor one applied recently
                (an earlier chunk of this writer was not applied; nothing of it is).
        """
        if chunk.seq < self.next_seq and chunk.seq in self.replies:
            return self.replies[chunk.seq]
        if chunk.seq != self.next_seq or (chunk.first != self.applied and not chunk.restart):
            raise InvalidArgumentError(
                f"writer chunk {chunk.seq} (stream steps from {chunk.first}) was not applied: "
                f"this writer's stream stands at chunk {self.next_seq}, step {self.applied} "
                "(an earlier chunk was not applied; the writer sends it again)"
            )
        return None

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
                if getattr(table, "_closed", False):
                    raise ClosedError(f"table {table.name!r} is closed")
                if m and not admits(table, m):
                    return None
            runs, appends, total = self._plan(chunk, store.next_id)
            if total and not store_has_room(store, total):
                return None
            ids = _store_ids(runs, chunk.anchor, chunk.need)
            oldest = max(0, store.next_id + total - store.capacity)
            if len(ids) and ids.min() < oldest:
                raise InvalidArgumentError(
                    f"items anchored at stream steps {describe(chunk.anchor[ids < oldest][:4])} "
                    "reach steps the store no longer holds; keep the store larger than the "
                    "steps in flight, or create items sooner"
                )
            self._check_repeats(chunk, ids)
            # Validated and admitted: nothing below fails for the chunk's own reasons.
            runs = self._append(chunk, appends)
            ids = _store_ids(runs, chunk.anchor, chunk.need)
            if len(ids) and ids.min() < store.oldest_id:  # only if others' copies came first
                raise InvalidArgumentError(
                    "the chunk's items reach steps that copies for other writers overwrote "
                    "while it was appended; its steps are stored, its items are not (enlarge "
                    "the store)"
                )
            keys = self._create(chunk, ids)
        if chunk.restart or chunk.first != self.applied:
            self.episode_start = chunk.first
        if chunk.starts:
            self.episode_start = chunk.starts[-1]
        self.runs = [r for r in runs if r[1] > chunk.first + chunk.n - self.history]
        self.applied = chunk.first + chunk.n
        self.next_seq = chunk.seq + 1
        self.replies[chunk.seq] = keys
        while len(self.replies) > KEPT_REPLIES:
            self.replies.popitem(last=False)
        return keys

    def blocked_by(self, chunk: Chunk) -> Table:
        """The table whose rate limiter keeps ``chunk`` waiting (the first table when it
        waits for room in the store), for blocked-time accounting."""
        for t, m in enumerate(chunk.counts.tolist()):
            table = self.tables[t]
            if m and not admits(table, m):
                return table
        return self.tables[0]

    # --------------------------------------------------------------- planning
    def _plan(self, chunk: Chunk, next_id: int) -> tuple[list, list, int]:
        """The runs after the chunk's steps are appended at ``next_id``, the appends
        (``(stream a, stream b, context store ids or None)``) and the steps they add."""
        restart = chunk.restart or chunk.first != self.applied
        runs = [] if restart else [r for r in self.runs if r[1] > chunk.first - self.history]
        episode_start = chunk.first if restart else self.episode_start
        bounds = [chunk.first, *[s for s in chunk.starts if s > chunk.first], chunk.first + chunk.n]
        appends: list = []
        total = 0
        for a, b in pairwise(bounds):
            if a in chunk.starts:
                episode_start = a
            if b == a:
                continue  # no steps: nothing to append, no context to copy
            last = runs[-1] if runs else None
            extends = last is not None and last[1] == a and last[2] + (a - last[0]) == next_id
            context = None
            lo = a
            if last is not None and not extends and last[1] == a:
                lo = max(episode_start, a - (self.history - 1), last[0])
                if lo < a:
                    context = last[2] + np.arange(lo - last[0], a - last[0])
                    if context.min() < max(0, next_id - self.store.capacity):
                        context, lo = None, a  # overwritten: later items cannot reach it
            count = (b - a) + (a - lo)
            if extends:
                runs[-1] = (last[0], b, last[2])
            elif count:
                runs.append((lo, b, next_id))
            appends.append((a, b, context))
            next_id += count
            total += count
        return runs, appends, total

    def _check_repeats(self, chunk: Chunk, ids: np.ndarray) -> None:
        low = chunk.first - self.history
        for t in range(len(self.tables)):
            recent = self.recent[t]
            self.recent[t] = recent = recent[recent[:, 0] >= low]
            if len(recent) and chunk.counts[t]:
                mine = chunk.table == t
                if np.isin(ids[mine], recent[:, 1]).any():
                    raise InvalidArgumentError(
                        f"writer chunk creates an item in table {self.tables[t].name!r} at an "
                        "anchor an earlier chunk already used; a table holds at most one item "
                        "per anchor step"
                    )

    # --------------------------------------------------------------- applying
    def _append(self, chunk: Chunk, appends: list) -> list:
        """Append the planned steps, each segment with its context in one append (so they
        stay contiguous); returns the runs with the ids the store gave them (it may copy
        other writers' steps or a stack's items to its head first, shifting ids)."""
        store = self.store
        restart = chunk.restart or chunk.first != self.applied
        runs = [] if restart else [r for r in self.runs if r[1] > chunk.first - self.history]
        for a, b, context in appends:
            data = {p: arr[a - chunk.first : b - chunk.first] for p, arr in chunk.steps.items()}
            lo = a
            if context is not None:
                lo = a - len(context)
                old = store.read(context)
                data = {p: np.concatenate([old[p], data[p]]) for p in data}
            start = store._append_locked(data, b - lo)
            last = runs[-1] if runs else None
            if lo == a and last is not None and last[1] == a and last[2] + (a - last[0]) == start:
                runs[-1] = (last[0], b, last[2])
            else:
                runs.append((lo, b, start))
        return runs

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
            created = np.stack([chunk.anchor[mine], ids[mine]], axis=1)
            self.recent[t] = np.concatenate([self.recent[t], created])
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
