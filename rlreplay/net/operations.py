"""The operations a :class:`~rlreplay.Server` serves, one ``_op_<name>`` method each.

Each takes the decoded request header and arrays and returns ``(reply header, reply
arrays)``, or a :class:`~rlreplay.net.handlers.Job` when a rate limiter may block it (the
server attempts and parks jobs). Wire formats are listed in ``docs/protocol.md``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, ProtocolError, describe
from rlreplay.net import handlers
from rlreplay.net.ingest import WriterSession
from rlreplay.net.sessions import WriterSessions
from rlreplay.net.shm_server import SharedSegments


class TableOperations:
    """Mixin of :class:`Server`: expects ``tables``, ``_descriptions``, ``_rates``,
    ``_sessions`` (a :class:`~rlreplay.net.sessions.WriterSessions`) and ``_caller`` (the
    routing id of the client whose request is being served) attributes."""

    tables: dict[str, Table]
    _sessions: WriterSessions
    _shm: SharedSegments
    _caller: bytes
    _direct: Any  # the server's DirectLinks, or None

    def _table(self, header: dict) -> Table:
        name = header.get("table")
        if not isinstance(name, str) or name not in self.tables:
            raise InvalidArgumentError(
                f"table {describe(name)} is not served here; tables: {sorted(self.tables)}"
            )
        return self.tables[name]

    def _op_ping(self, header, arrays):
        reply = {"tables": sorted(self.tables), "max_message_bytes": self.max_message_bytes}
        links = self._direct
        if header.get("direct") and links is not None and type(self._caller) is bytes:
            offer = links.offer(self._caller, time.monotonic())
            if offer is not None:  # a same-host client's small calls may skip ZeroMQ
                reply["direct"] = offer
        return reply, None

    def _op_describe(self, header, arrays):
        return {"tables": self._descriptions}, None

    def _op_info(self, header, arrays):
        names = [self._table(header).name] if header.get("table") is not None else list(self.tables)
        return {"tables": {n: self.table_stats(n) for n in names}}, None

    def table_stats(self, name: str) -> dict[str, Any]:
        """``TableInfo`` of ``name`` as a dict plus rates over the last ~10 seconds."""
        info = self.tables[name].info().to_dict()
        snaps = self._rates[name]
        ins_rate = smp_rate = 0.0
        if len(snaps) >= 2 and snaps[-1][0] > snaps[0][0]:
            dt = snaps[-1][0] - snaps[0][0]
            ins_rate = (snaps[-1][1] - snaps[0][1]) / dt
            smp_rate = (snaps[-1][2] - snaps[0][2]) / dt
        info["inserts_per_s"] = ins_rate
        info["samples_per_s"] = smp_rate
        info["samples_per_insert"] = info["samples"] / info["inserts"] if info["inserts"] else 0.0
        return info

    def _op_can_insert(self, header, arrays):
        n = header.get("n")
        n = 1 if n is None else n
        return {"result": bool(self._table(header).can_insert(n))}, None

    def _op_can_sample(self, header, arrays):
        n = header.get("n")
        n = 1 if n is None else n
        return {"result": bool(self._table(header).can_sample(n))}, None

    def _op_sample(self, header, arrays):
        table = self._table(header)
        n = handlers.check_batch_size(header.get("batch_size"), table)
        now = time.monotonic()
        deadline = handlers.deadline_of(header, now)
        target = self._shm.target(self._caller, header.get("shm"), now)
        updated = None
        if arrays:  # a priority update carried by the request: applied first, at once
            updated = self._carried_update(table, arrays)
        return handlers.SampleJob(table, n, deadline, updated, target)

    def _op_sampler_state(self, header, arrays):
        """Size, sampler mass and config of a table (for a sharded client), after the
        priority update the request may carry (as a sample request's)."""
        table = self._table(header)
        reply = {}
        if arrays:
            reply["updated"] = self._carried_update(table, arrays)
        reply.update(handlers.sampler_state(table))
        return reply, None

    def _carried_update(self, table: Table, arrays: dict) -> int:
        """Apply the priority update a request carries as ``update/keys`` and
        ``update/priorities``; the count updated."""
        keys, prios = arrays.get("update/keys"), arrays.get("update/priorities")
        if keys is None or prios is None:
            raise ProtocolError(
                "a request carries an update as both 'update/keys' and "
                f"'update/priorities'; it has {sorted(arrays)}"
            )
        return int(table.update_priorities(keys, prios))

    def _op_insert(self, header, arrays):
        table = self._table(header)
        rows, n = handlers.rows_from(arrays, table)
        prios = arrays.get("priorities")
        if prios is None and header.get("priority") is not None:
            prios = header["priority"]
        if prios is not None:
            prios = check_priorities(prios, n)
        deadline = handlers.deadline_of(header, time.monotonic())
        return handlers.InsertJob(table, rows, n, prios, deadline)

    def _op_update_priorities(self, header, arrays):
        table = self._table(header)
        keys, prios = arrays.get("keys"), arrays.get("priorities")
        if keys is None:  # an update of no keys
            keys = np.zeros(0, np.int64)
        if prios is None:
            prios = np.zeros(0)
        return {"count": int(table.update_priorities(keys, prios))}, None

    def _op_delete(self, header, arrays):
        table = self._table(header)
        return {"count": int(table.delete(arrays.get("keys", np.zeros(0, np.int64))))}, None

    def _op_reset(self, header, arrays):
        self._table(header).reset()
        return {}, None

    def _op_write(self, header, arrays):
        key = header["writer"]
        now = time.monotonic()
        names, history = header["tables"], header["history"]
        session = self._sessions.get(key, now)
        if session is None:
            session = self._new_session(header)
            self._sessions.add(key, session, self._caller, now)
        elif names != [t.name for t in session.tables] or history != session.history:
            raise InvalidArgumentError(
                f"writer id {describe(key)} belongs to a writer of tables "
                f"{[t.name for t in session.tables]} with history {session.history}, "
                f"not {describe(names)} with history {history}; writer ids must be unique"
            )
        deadline = handlers.deadline_of(header, now)
        registered = self._sessions.first_applied
        job = handlers.WriteJob(session, header, arrays, deadline, lambda: registered(key))
        self._sessions.release_idle(now)
        return job

    def _new_session(self, header: dict) -> WriterSession:
        """The session of a writer not seen before (or forgotten), checked against the
        served tables; it retains nothing until its first chunk is applied.

        Raises:
            InvalidArgumentError: for unknown tables, tables on different stores or on a
                store with lanes, or a ``history`` out of range.
        """
        names, history = header["tables"], header["history"]
        tables = [self._table({"table": n}) for n in names]
        store = tables[0].store
        if any(t.store is not store for t in tables):
            raise InvalidArgumentError(f"tables {names} do not share one step store")
        if store.lanes != 1:
            raise InvalidArgumentError(
                f"tables {names} are over a store with lanes={store.lanes}; a trajectory "
                "writer appends to a single-lane store (use a vector adder)"
            )
        spans = max(t.layout.span for t in tables)
        if not spans <= history <= store.capacity:
            raise InvalidArgumentError(f"history={history} must be in [{spans}, {store.capacity}]")
        session = WriterSession(tables, history)
        seq = header.get("seq")
        if seq:  # the server forgot the writer (idle too long): go on from its chunk
            session.next_seq, session.applied = seq, header["first"]
            session.episode_start = header["first"]
        return session

    def _op_close_writer(self, header, arrays):
        self._sessions.close(header["writer"])
        return {}, None
