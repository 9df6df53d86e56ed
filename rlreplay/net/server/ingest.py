"""Server side of remote writers: apply each chunk of steps and items whole, or not at all.

Items name their anchor by *stream index* (the step's position in all this writer appended).
Invariant: every check runs before the first change, and a chunk sent twice (same sequence
number) is answered with its first keys, not applied again.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from rlreplay.core.overwrite import Retention
from rlreplay.core.table import Table
from rlreplay.errors import ClosedError, InvalidArgumentError, ProtocolError, describe

KEPT_REPLIES = 64  # replies a session keeps for chunks sent again


def admits(table: Table, m: int) -> bool:
    """Whether ``table``'s limiter admits ``m`` items at once now (lock held)."""
    return table.rate_limiter.can_insert(m, table.size)


class WriterSession:
    """One remote writer's stream state on the server.

    It holds no server state until its first chunk is applied (see :attr:`registered`).

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
        # the table that kept the last refused chunk waiting, for blocked-time accounting
        self.blocker = tables[0]
        self.applied = 0  # stream index one past the last applied chunk's steps
        self.episode_start = 0  # stream index where the current episode began
        # The newest ``history`` steps of the current episode, which later items may reach
        # and the overwrite protocol never overwrites; None until the first chunk.
        self.retention: Retention | None = None
        # Per table: anchors of recent items, to refuse a repeated anchor before any change.
        self.recent: list[np.ndarray] = [np.zeros(0, np.int64) for _ in tables]
        self.replies: OrderedDict[int, np.ndarray] = OrderedDict()
        self.pending: deque = deque()  # WriteJobs of this writer, oldest first
        # restored from a checkpoint, no chunk applied since (see :meth:`skipped`)
        self.resumed = False

    @property
    def registered(self) -> bool:
        """Whether a chunk of this writer was applied (it then retains steps)."""
        return self.retention is not None

    @property
    def retained(self) -> int:
        """Steps this writer retains now."""
        return 0 if self.retention is None else self.retention.count

    def parse(self, header: dict, arrays: dict) -> Chunk:
        """:meth:`Chunk.parse` for this session."""
        return Chunk.parse(self, header, arrays)

    def replayed(self, header: dict) -> np.ndarray | None:
        """Keys of chunk ``header`` if already applied (sent again after a lost reply), else
        None; InvalidArgumentError if its reply is no longer kept. Asked before the chunk is
        parsed: a chunk sent again would fail checks against the stream as it stands now."""
        seq = header.get("seq")
        if seq is None or seq >= self.next_seq:
            return None
        keys = self.replies.get(seq)
        if keys is None:
            raise InvalidArgumentError(
                f"writer chunk {seq} was applied too long ago to be answered again: its items "
                f"are stored, but the server keeps its replies only to a writer's last "
                f"{KEPT_REPLIES} chunks and this writer's stream stands at chunk "
                f"{self.next_seq}; keep at most {KEPT_REPLIES} chunks unacknowledged"
            )
        return keys

    def skipped(self, seq: int | None) -> bool:
        """Whether chunk ``seq`` follows chunks lost with a restored server."""
        return self.resumed and seq is not None and seq > self.next_seq

    def check_next(self, chunk: Chunk) -> None:
        """Refuse (InvalidArgumentError) a ``chunk`` not continuing the applied chunks."""
        if self.skipped(chunk.seq):
            return
        if chunk.seq != self.next_seq or (chunk.first != self.applied and not chunk.restart):
            raise InvalidArgumentError(
                f"writer chunk {chunk.seq} (stream steps from {chunk.first}) was not applied: "
                f"this writer's stream stands at chunk {self.next_seq}, step {self.applied} "
                "(an earlier chunk was not applied; the writer sends it again)"
            )

    def apply(self, chunk: Chunk) -> np.ndarray | None:
        """Apply the whole chunk if every table admits its items and the store has room;
        returns the items' keys in creation order, or None (nothing changed) to wait. Nothing
        fails after the first change.

        Raises:
            InvalidArgumentError: if an item needs steps no longer retained, repeats an
                earlier anchor, or the store cannot hold the chunk; nothing changes.
            ClosedError: if one of the tables was closed; nothing changes.
        """
        store = self.store
        with store.mutex:
            for t, m in enumerate(chunk.counts.tolist()):
                table = self.tables[t]
                if m and table.closed:
                    raise ClosedError(f"table {table.name!r} is closed")
                if m and not admits(table, m):
                    self.blocker = table
                    return None
            keep = self._continued(chunk)
            self._check_reach(chunk, keep)
            self._check_repeats(chunk)
            self._check_priorities(chunk)
            # the first change, all or nothing: room for every step
            own = self.retention
            if chunk.n and store.overwrite.make_room(chunk.n, own=own, keep=keep) is None:
                self.blocker = self.tables[0]
                return None
            base = self._write(chunk, keep)
            keys = self._create(chunk, base + (chunk.anchor - chunk.first))
        if chunk.starts or self._new_episode(chunk):
            self.episode_start = self._last_start(chunk)
        self.applied = chunk.first + chunk.n
        self.next_seq = chunk.seq + 1
        self.resumed = False
        self.replies[chunk.seq] = keys
        while len(self.replies) > KEPT_REPLIES:
            self.replies.popitem(last=False)
        return keys

    def close(self) -> None:
        """Let the retained steps go for good (the writer closed)."""
        if self.retention is not None:
            with self.store.mutex:
                self.store.overwrite.forget(self.retention)

    def release(self) -> None:
        """Let the retained steps go (writer silent too long, or the store needs room)."""
        if self.retention is not None:
            with self.store.mutex:
                self.retention.release()

    def state(self) -> dict:
        """The stream's position for a server checkpoint (store lock held)."""
        own = self.retention
        seqs = np.fromiter(self.replies, np.int64, len(self.replies))
        kept = list(self.replies.values())
        return {
            "tables": [t.name for t in self.tables],
            "history": self.history,
            "next_seq": self.next_seq,
            "applied": self.applied,
            "episode_start": self.episode_start,
            "resumed": self.resumed,
            "retention": None if own is None else [own.first, own.count],
            "recent": {str(t): r for t, r in enumerate(self.recent)},  # per table index
            "reply_seqs": seqs,
            "reply_counts": np.array([len(k) for k in kept], np.int64),
            "reply_keys": np.concatenate(kept) if kept else np.zeros(0, np.int64),
        }

    @classmethod
    def from_state(cls, tables: list[Table], state: dict) -> WriterSession:
        """The session :meth:`state` describes, over the restored ``tables``."""
        session = cls(tables, int(state["history"]))
        session.next_seq = int(state["next_seq"])
        session.applied = int(state["applied"])
        session.episode_start = int(state["episode_start"])
        session.resumed = True
        recent = state["recent"]
        session.recent = [np.asarray(recent[str(t)], np.int64) for t in range(len(tables))]
        ends = np.cumsum(np.asarray(state["reply_counts"], np.int64))
        keys = np.asarray(state["reply_keys"], np.int64)
        for seq, end, n in zip(state["reply_seqs"], ends, state["reply_counts"]):
            session.replies[int(seq)] = keys[end - n : end].copy()
        if state["retention"] is not None:
            first, count = (int(v) for v in state["retention"])
            with session.store.mutex:
                own = session.retention = session.store.overwrite.retain(session.history)
                if count and session.store.is_stored(first) and session.store.is_stored(
                    first + count - 1
                ):
                    own.extend(first, count)
        return session

    def _new_episode(self, chunk: Chunk) -> bool:
        """Whether ``chunk`` begins a new episode at its first step."""
        return (
            chunk.restart
            or chunk.first != self.applied
            or bool(chunk.starts and chunk.starts[0] == chunk.first)
        )

    def _continued(self, chunk: Chunk) -> int:
        """How many retained steps ``chunk`` continues."""
        if chunk.restart or chunk.first != self.applied:
            return 0
        if not (chunk.starts and chunk.starts[0] == chunk.first):
            return self.retained
        back = chunk.first - int(chunk.anchor.min()) if len(chunk.anchor) else 0
        return min(max(back, 0), self.retained)

    def _last_start(self, chunk: Chunk) -> int | None:
        """Stream index where the chunk's last episode begins, if one begins in it."""
        if chunk.starts:
            return chunk.starts[-1]
        return chunk.first if self._new_episode(chunk) else None

    def _check_reach(self, chunk: Chunk, keep: int) -> None:
        """Refuse items reaching before the ``keep`` retained steps the chunk continues."""
        early = chunk.anchor < chunk.first - keep
        if early.any():
            raise InvalidArgumentError(
                f"items anchored at stream steps {describe(chunk.anchor[early][:4].tolist())} "
                "reach steps no longer retained for their episode; create items over at most "
                "`history` recent steps (and keep the store larger than the traffic in flight)"
            )

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

    def _write(self, chunk: Chunk, keep: int) -> int:
        """Write the chunk's steps in one contiguous write after the kept steps (safe as
        ``Chunk.parse`` ensures ``n <= capacity - history``); returns the id of ``chunk.first``."""
        own = self.retention
        if own is None:  # the first chunk applied: the writer now retains steps
            own = self.retention = self.store.overwrite.retain(self.history)
        last = self._last_start(chunk)
        if not chunk.n:
            if last is not None:
                own.release()
            return own.end
        first = self.store.write(chunk.steps, chunk.n)
        if last is None:
            own.extend(first, chunk.n)  # continues the retained steps (or starts afresh)
        else:
            own.release()  # a new episode: earlier steps are no longer reachable
            own.extend(first + (last - chunk.first), chunk.first + chunk.n - last)
        return first

    def _check_priorities(self, chunk: Chunk) -> None:
        """Refuse items whose priority a table's selectors could not take."""
        for t, m in enumerate(chunk.counts.tolist()):
            if m:
                given = chunk.priority[chunk.table == t]
                given = given[~np.isnan(given)]  # (NaN: the table's default)
                self.tables[t].index.check_priority_range(given, "item priorities")

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


def _priorities(table: Table, prios: np.ndarray) -> np.ndarray | None:
    missing = np.isnan(prios)
    if missing.all():
        return None
    if missing.any():
        prios = prios.copy()
        fill = table.default_priority
        prios[missing] = table.index.max_priority if fill is None else fill
    return prios


class Chunk:
    """One ``write`` request, checked against its session (nothing changed by parsing).

    Attributes:
        seq: the chunk's sequence number in its writer's stream.
        first, n: stream index of its first step, and its number of steps.
        steps: field path -> ``[n, ...]`` array in the store's dtype.
        table, anchor, need, priority, length: per item: table index, anchor, stream index
            past its last step, priority (NaN: default), extent (``-1``: the span).
        starts: stream indices in ``[first, first + n)`` where an episode begins.
        restart: the writer dropped earlier chunks; a new episode begins at ``first``.
    """

    @classmethod
    def parse(cls, session: WriterSession, header: dict, arrays: dict) -> Chunk:
        """Check a ``write`` request (header fields already type-checked by the schema).

        Raises:
            ProtocolError: for malformed steps, item arrays or episode starts.
            InvalidArgumentError: for an invalid item or too many steps for the store.
            DeadlockError: for more items of one table than its limiter could ever admit.
        """
        c = cls()
        c.first, c.n = header["first"], header["n"]
        seq = header.get("seq")
        c.seq = session.next_seq if seq is None else seq  # older clients send no seq
        c.restart = (
            bool(header.get("restart"))
            or (seq is None and c.first != session.applied)
            or session.skipped(seq)
        )
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
        c.items_from(session, arrays)
        return c

    def items_from(self, session: WriterSession, arrays: dict) -> None:
        """Check and take the chunk's items (``item_*`` arrays) against ``session``."""
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
        # every item lies in one episode, sent by this chunk's end, at most ``history`` back
        end = self.first + self.n
        floor = self.first if self.restart else session.episode_start
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
            order = np.lexsort((anchor, table))  # by table, then anchor: repeats adjoin
            t, a = table[order], anchor[order]
            if ((t[1:] == t[:-1]) & (a[1:] == a[:-1])).any():
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
