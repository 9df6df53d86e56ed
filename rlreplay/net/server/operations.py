"""The operations a :class:`~rlreplay.Server` serves: the table :data:`OPERATIONS`.

Handlers are methods of :class:`ServerOperations`; each returns ``(reply header, reply
arrays)``, or a :class:`~rlreplay.net.server.jobs.Job` when a rate limiter may block it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.core import table_checks
from rlreplay.core.keys import check_priorities
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, ProtocolError, describe
from rlreplay.net.server import jobs
from rlreplay.net.server.ingest import WriterSession
from rlreplay.net.server.jobs import sample_credit, sampler_mass
from rlreplay.net.server.parking import ParkedCalls
from rlreplay.net.server.sessions import WriterSessions
from rlreplay.net.server.shm import SharedSegments
from rlreplay.net.wire import schema
from rlreplay.net.wire.schema import INT, NUM, TIMEOUT, Operation

if TYPE_CHECKING:
    from rlreplay.net.server.checkpoints import ServerCheckpoints

RATE_SNAPSHOTS = 12  # snapshots of each table's counters kept, one a second: the rates' span


def served_tables(given: Any) -> dict[str, Table]:
    """The tables a server is given, by name.

    Raises:
        InvalidArgumentError: unless a non-empty iterable of tables with unique names.
    """
    tables = list(given) if isinstance(given, (list, tuple)) else None
    if tables is None and isinstance(given, Iterable) and not isinstance(given, str):
        tables = list(given)  # e.g. a dict's .values()
    if tables is None or not all(isinstance(t, Table) for t in tables):
        raise InvalidArgumentError(
            f"tables={describe(given)} must be a list of tables, e.g. Server([table])"
        )
    names = [t.name for t in tables]
    if not tables or len(set(names)) != len(names):
        raise InvalidArgumentError(f"tables {names} must be a non-empty list with unique names")
    return {t.name: t for t in tables}


def table_description(table: Table, store_index: int) -> dict[str, Any]:
    """What a client needs to validate data and build writers for ``table``."""
    return {
        "signature": table.store.signature.to_json(),
        "layout": table.layout.to_json(),
        "span": table.layout.span,
        "is_rows": table.layout.is_rows,
        "store": store_index,
        "store_capacity": table.store.capacity,
        "lanes": table.store.lanes,
        "max_size": table.max_size,
        "insert_window": insert_window(table),
    }


def insert_window(table: Table) -> int | None:
    """The most items a writer chunk may hold for ``table`` (None: no limit)."""
    window = table.rate_limiter.insert_window()
    if window >= table.max_size:
        return None
    return int(window)


def sampler_state(table: Table) -> dict[str, Any]:
    """What a sharded client needs to split a batch over shards (read under the lock)."""
    with table.mutex:
        return {
            "table_size": int(table.index.size),
            "mass": sampler_mass(table),
            "min_probability": float(table.index.sampler.min_probability()),
            "sampler": table.index.sampler.config(),
            "store_capacity": int(table.store.capacity),
            "credit": sample_credit(table),
        }


def check_batch_size(value: Any, table: Table) -> int:
    n = table_checks.check_batch_size(value, table.max_size)
    table.rate_limiter.check_sample_batch(n)
    return n


def rows_from(arrays: dict[str, np.ndarray], table: Table) -> tuple[dict, int]:
    rows = {k[5:]: v for k, v in arrays.items() if k.startswith("data/")}
    if not table.layout.is_rows:
        raise InvalidArgumentError(
            f"table {table.name!r} has items spanning {table.layout.span} steps; insert() "
            "stores one row per item, so append steps with a TrajectoryWriter instead"
        )
    data, n = table.store.signature.check_batch(rows, "rows")
    if n < 1 or n > table.max_size or n % table.store.lanes:
        raise InvalidArgumentError(
            f"rows hold {n} rows; insert between 1 and max_size={table.max_size} at once"
        )
    table.rate_limiter.check_insert_batch(n)
    return data, n


def deadline_of(header: dict, now: float) -> float | None:
    """When a call with this header's (already checked) ``timeout`` gives up; None: never."""
    timeout = header.get("timeout")
    return None if timeout is None else now + float(timeout)


class ServerOperations:
    """The handlers of a server's operations (see :data:`OPERATIONS`), over what they serve.

    Args:
        tables: the served tables by name (see :func:`served_tables`).
        sessions, shm, checkpoints: the writer sessions, shared memory and checkpoints.
        max_message_bytes: the largest request the server takes (told by ``ping``).

    Attributes:
        caller: routing id of the client whose request is being served.
    """

    def __init__(
        self,
        tables: dict[str, Table],
        sessions: WriterSessions,
        shm: SharedSegments,
        checkpoints: ServerCheckpoints,
        max_message_bytes: int,
        parked: ParkedCalls,
    ):
        self.tables = tables
        self._parked = parked
        self._sessions = sessions
        self._shm = shm
        self._checkpoints = checkpoints
        self.max_message_bytes = max_message_bytes
        self.caller: Any = b""
        stores: list = []
        for t in tables.values():
            if not any(t.store is s for s in stores):
                stores.append(t.store)
        self._descriptions = {
            name: table_description(
                t, next(i for i, s in enumerate(stores) if s is t.store)
            )
            for name, t in tables.items()
        }
        self._rates = {n: deque(maxlen=RATE_SNAPSHOTS) for n in tables}

    def record_rates(self, now: float) -> None:
        """Snapshot every table's insert and sample counters for :meth:`table_stats`."""
        for name, t in self.tables.items():
            lim = t.rate_limiter
            self._rates[name].append((now, lim.inserts, lim.samples))

    def _table(self, header: dict) -> Table:
        name = header.get("table")
        if not isinstance(name, str) or name not in self.tables:
            raise InvalidArgumentError(
                f"table {describe(name)} is not served here; tables: {sorted(self.tables)}"
            )
        return self.tables[name]

    def ping(self, header, arrays):
        return {"tables": sorted(self.tables), "max_message_bytes": self.max_message_bytes}, None

    def describe(self, header, arrays):
        return {"tables": self._descriptions}, None

    def info(self, header, arrays):
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

    def can_insert(self, header, arrays):
        n = header.get("n")
        n = 1 if n is None else n
        return {"result": bool(self._table(header).can_insert(n))}, None

    def can_sample(self, header, arrays):
        n = header.get("n")
        n = 1 if n is None else n
        return {"result": bool(self._table(header).can_sample(n))}, None

    def sample(self, header, arrays):
        table = self._table(header)
        n = check_batch_size(header.get("batch_size"), table)
        now = time.monotonic()
        deadline = deadline_of(header, now)
        target = self._shm.target(self.caller, header.get("shm"), now)
        updated = None
        if arrays:  # a priority update carried by the request: applied first, at once
            updated = self._carried_update(table, arrays)
        return jobs.SampleJob(table, n, deadline, updated, target)

    def sampler_state(self, header, arrays):
        """A table's size and sampler state, after any priority update carried."""
        table = self._table(header)
        reply = {}
        if arrays:
            reply["updated"] = self._carried_update(table, arrays)
        reply.update(sampler_state(table))
        return reply, None

    def _carried_update(self, table: Table, arrays: dict) -> int:
        """Apply the priority update a request carries; returns the count."""
        keys, prios = arrays.get("update/keys"), arrays.get("update/priorities")
        if keys is None or prios is None:
            raise ProtocolError(
                "a request carries an update as both 'update/keys' and "
                f"'update/priorities'; it has {sorted(arrays)}"
            )
        return int(table.update_priorities(keys, prios))

    def insert(self, header, arrays):
        table = self._table(header)
        rows, n = rows_from(arrays, table)
        prios = arrays.get("priorities")
        if prios is None and header.get("priority") is not None:
            prios = header["priority"]
        if prios is not None:
            prios = check_priorities(prios, n)
        deadline = deadline_of(header, time.monotonic())
        return jobs.InsertJob(table, rows, n, prios, deadline)

    def update_priorities(self, header, arrays):
        table = self._table(header)
        keys, prios = arrays.get("keys"), arrays.get("priorities")
        if keys is None:  # an update of no keys
            keys = np.zeros(0, np.int64)
        if prios is None:
            prios = np.zeros(0)
        return {"count": int(table.update_priorities(keys, prios))}, None

    def delete(self, header, arrays):
        table = self._table(header)
        return {"count": int(table.delete(arrays.get("keys", np.zeros(0, np.int64))))}, None

    def reset(self, header, arrays):
        self._table(header).reset()
        return {}, None

    def write(self, header, arrays):
        key = header["writer"]
        now = time.monotonic()
        names, history = header["tables"], header["history"]
        session = self._sessions.get(key, now)
        if session is None:
            session = self._new_session(header)
            self._sessions.add(key, session, self.caller, now)
        elif names != [t.name for t in session.tables] or history != session.history:
            raise InvalidArgumentError(
                f"writer id {describe(key)} belongs to a writer of tables "
                f"{[t.name for t in session.tables]} with history {session.history}, "
                f"not {describe(names)} with history {history}; writer ids must be unique"
            )
        deadline = deadline_of(header, now)
        registered = self._sessions.first_applied
        job = jobs.WriteJob(session, header, arrays, deadline, lambda: registered(key))
        self._sessions.release_idle(now)
        return job

    def _new_session(self, header: dict) -> WriterSession:
        """A new session for an unseen (or forgotten) writer, checked against the tables."""
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

    def close_writer(self, header, arrays):
        self._sessions.close(header["writer"])
        return {}, None

    def shm_attach(self, header, arrays):
        """Map a same-host client's shared-memory segment (see :mod:`rlreplay.net.client.shm`)."""
        return self._shm.attach(self.caller, header, time.monotonic()), None

    def shm_detach(self, header, arrays):
        return self._shm.detach(self.caller, header), None

    def cancel(self, header, arrays):
        """Drop this client's parked calls ``rids`` unanswered (so they draw no items)."""
        return {"cancelled": self._parked.cancel(self.caller, header["rids"])}, None

    def checkpoint(self, header, arrays):
        deadline = deadline_of(header, time.monotonic())
        return self._checkpoints.request(deadline, self.tables, self._sessions)


# Arrays from a user's call: a wrong kind is InvalidArgumentError (the table checks shapes
# and values); arrays only the library writes: ProtocolError.
_USER, _LIB = InvalidArgumentError, ProtocolError
_TABLE = {"table": (schema.table_name, True)}
_UPDATE = {"update/keys": (INT, None, _USER), "update/priorities": (NUM, None, _USER)}
_S = ServerOperations
OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation("ping", _S.ping),
        Operation("describe", _S.describe),
        Operation("info", _S.info, {"table": (schema.table_name, False)}),
        Operation("can_insert", _S.can_insert, {**_TABLE, "n": (schema.positive_count, False)}),
        Operation("can_sample", _S.can_sample, {**_TABLE, "n": (schema.positive_count, False)}),
        Operation(
            "insert",
            _S.insert,
            {**_TABLE, "priority": (schema.priority, False), **TIMEOUT},
            {"priorities": (NUM, None, _USER)},
            data=True,
            mutates=True,
            parks=True,
        ),
        Operation(
            "sample",
            _S.sample,
            {
                **_TABLE,
                "batch_size": (schema.positive_count, True),
                "shm": (schema.stream, False),
                **TIMEOUT,
            },
            _UPDATE,
            mutates=True,
            parks=True,
        ),
        Operation("sampler_state", _S.sampler_state, _TABLE, _UPDATE),
        Operation(
            "update_priorities",
            _S.update_priorities,
            _TABLE,
            {"keys": (INT, None, _USER), "priorities": (NUM, None, _USER)},
            mutates=True,
        ),
        Operation("delete", _S.delete, _TABLE, {"keys": (INT, None, _USER)}, mutates=True),
        Operation("reset", _S.reset, _TABLE, mutates=True),
        Operation(
            "write",
            _S.write,
            {
                "writer": (schema.writer_id, True),
                "tables": (schema.table_names, True),
                "history": (schema.size, True),
                "seq": (schema.stream, False),
                "first": (schema.stream, True),
                "n": (schema.size, True),
                "episode_starts": (schema.stream_indices, False),
                "restart": (schema.flag, False),
                **TIMEOUT,
            },
            {
                "item_table": (INT, (1,), _LIB),
                "item_anchor": (INT, (1,), _LIB),
                "item_priority": (NUM, (1,), _LIB),
                "item_length": (INT, (1,), _LIB),
            },
            data=True,
            mutates=True,
            parks=True,
        ),
        Operation("close_writer", _S.close_writer, {"writer": (schema.writer_id, True)}),
        Operation("cancel", _S.cancel, {"rids": (schema.stream_indices, True)}),
        Operation("checkpoint", _S.checkpoint, TIMEOUT, parks=True),
        # their fields are checked by rlreplay.net.server.shm, the one place that reads them
        Operation("shm_attach", _S.shm_attach),
        Operation("shm_detach", _S.shm_detach),
    )
}
