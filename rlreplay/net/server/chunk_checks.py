"""A remote writer's chunk, checked in full before anything changes.

:meth:`Chunk.parse` checks every field of a ``write`` request against the writer's
session on the server (:class:`~rlreplay.net.server.ingest.WriterSession`): the steps' shapes and
dtypes, each item's table, anchor, extent and priority, the episode starts and the
sizes. Only a chunk that passes is planned and applied, whole (see
:mod:`rlreplay.net.server.ingest`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlreplay.errors import InvalidArgumentError, ProtocolError, describe

if TYPE_CHECKING:
    from rlreplay.net.server.ingest import WriterSession


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
        # one episode (the one its anchor lies in), and no further back than the writer's
        # history. Steps before the chunk's first continue the episode of the writer's
        # previous chunk (unless the writer restarted its stream): an item created over
        # them travels with the next chunk, also when a new episode begins at its first
        # step (a chunk is also sent when it holds as many items as a limiter admits).
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
