"""The options every stream adder takes, checked and sized before any part is built.

:class:`~rlreplay.writers.stream.StreamAdder` and its subclasses share one set of
options (environments per call, autoreset mode, priority of new items, chunk length,
timeout, hand-over period, sequence tables). They are checked here, all before the
adder builds its writer, buffers or hand-over, so a bad option changes nothing, and
turned into the sizes those parts are built with (:class:`AdderOptions`).

The writer is one of them: what an adder writes through is a writer, or tables it
creates a :class:`~rlreplay.writers.trajectory_writer.TrajectoryWriter` over
(:func:`adder_writer`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.specs import Signature
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, check_count, check_timeout, describe
from rlreplay.writers.autoreset import mode_name
from rlreplay.writers.hand_over import check_every
from rlreplay.writers.sequence_items import SequenceItems
from rlreplay.writers.trajectory_writer import TrajectoryWriter

if TYPE_CHECKING:
    from rlreplay.runtime.interfaces import Writer


def _tables(writer: Any) -> list[Table] | None:
    """``writer`` as a list of tables, or ``None`` when it is a writer."""
    if isinstance(writer, Table):
        return [writer]
    if isinstance(writer, (list, tuple)) and writer and isinstance(writer[0], Table):
        return list(writer)
    return None


def writer_store(writer: Any) -> StepStore | None:
    """The store the adder's rows go to, when it is known locally (``None``: remote)."""
    tables = _tables(writer)
    return tables[0].store if tables else getattr(writer, "store", None)


# A writer an adder creates holds back at most 1/_HISTORY_SHARE of its store beyond the
# adder's capacity, so that many writers (one per actor) still fit (see adder_writer).
_HISTORY_SHARE = 32


def adder_writer(writer: Any, capacity: int, wanted: int | None = None) -> Writer:
    """``writer`` itself, or a :class:`TrajectoryWriter` over the given tables, keeping
    the ``capacity`` rows the adder may still reach back to, or up to ``wanted`` rows
    (what it stages, handed over as one chunk) as far as 1/32 of the store allows: each
    writer's retained rows are protected from overwriting, and a store must hold every
    writer's plus an append, so many writers on one store keep room.

    Raises:
        InvalidArgumentError: if the store or the writer's history is shorter than
            ``capacity``.
    """
    tables = _tables(writer)
    if tables is not None:
        store = tables[0].store
        if store.capacity < capacity:
            raise InvalidArgumentError(
                f"the store keeps {store.capacity} steps but this adder appends chunks "
                f"that need {capacity} (span - 1 + chunk_length + lag + pad + 2); "
                "lower chunk_length or enlarge the store"
            )
        history = max(capacity, min(wanted or capacity, store.capacity // _HISTORY_SHARE))
        writer = TrajectoryWriter(tables, history=history)
    history = writer.history
    if history < capacity:
        raise InvalidArgumentError(
            f"the writer keeps history={history} steps; this adder needs at least "
            f"{capacity} (span - 1 + chunk_length + lag + pad + 2); create it with "
            f"history={capacity} (TrajectoryWriter(tables, history={capacity}), or "
            f"client.trajectory_writer(tables, history={capacity})) or pass the tables"
        )
    return writer


# What rlreplay.runtime.interfaces.Writer declares: every writer an adder is given has it.
WRITER_MEMBERS = (
    "append_batch", "create_items", "end_episode", "flush", "close", "__exit__", "signature",
    "history", "tables",
)


def writer_signature(writer: Any) -> Signature:
    """The step signature of a writer (:class:`~rlreplay.runtime.interfaces.Writer`), or
    of the tables' store.

    Raises:
        InvalidArgumentError: for a writer without every member the interface declares,
            or anything else that is not a table or a list of tables.
    """
    tables = _tables(writer)
    if tables is not None:
        return tables[0].store.signature
    missing = [m for m in WRITER_MEMBERS if not hasattr(writer, m)]
    if not missing and isinstance(writer.signature, Signature):
        return writer.signature
    lacks = f"it lacks {missing}" if missing else "its signature is not a Signature"
    raise InvalidArgumentError(
        f"writer={describe(writer)} is not a Table, a list of Tables or a writer "
        f"(rlreplay.runtime.interfaces.Writer: {lacks}); pass the tables, a "
        "TrajectoryWriter or client.trajectory_writer(...)"
    )


def first_table_span(writer: Any) -> int:
    """The layout span of the first table of ``writer`` (a writer, a table or tables)."""
    tables = _tables(writer)
    return (tables or writer.tables)[0].layout.span


def table_span(writer: Writer, table: Any) -> int:
    """The layout span of ``table``: a table, or the name or handle of one of the
    writer's (checked by :func:`check_tables`)."""
    if isinstance(table, Table):
        return table.layout.span
    name = getattr(table, "name", table)
    return next(t.layout.span for t in writer.tables if t.name == name)


def check_tables(writer: Writer, tables: list[Any]) -> None:
    """Check that every table (a table or a name) is one of the writer's.

    Raises:
        InvalidArgumentError: naming the first table the writer does not write to.
    """
    own = list(writer.tables)
    names = [t.name for t in own]
    local = any(isinstance(t, Table) for t in own)  # else remote handles, known by name
    for table in tables:
        if isinstance(table, str):
            mine = table in names
        elif local:
            mine = any(table is t for t in own)
        else:
            mine = getattr(table, "name", None) in names
        if mine:
            continue
        raise InvalidArgumentError(
            f"table {describe(getattr(table, 'name', table))} is not one of the writer's "
            f"tables {names}; create the writer over it (or pass the tables to the adder)"
        )


def adder_tables(writer: Writer, tables: Any, sequence_tables: list[Any]) -> list[Any]:
    """The tables an adder fills with its own items: ``tables``, or (``None``) every
    table of the writer that is not one of ``sequence_tables``; all of them checked to
    be the writer's, sequence tables included.

    Raises:
        InvalidArgumentError: for no table to fill, or a table the writer does not
            write to (see :func:`check_tables`).
    """
    if tables is None:
        names = {getattr(t, "name", t) for t in sequence_tables}
        tables = [
            t for t in writer.tables if t not in sequence_tables and t.name not in names
        ]
    tables = list(tables)
    if not tables:
        raise InvalidArgumentError("tables is empty; give at least one table to fill")
    check_tables(writer, [*tables, *sequence_tables])
    return tables


DEFAULT_CHUNK_LENGTH = 64


def check_priority(priority: Any) -> None:
    """Check the priority an adder gives new items: a number >= 0, or ``None``.

    Raises:
        InvalidArgumentError: for anything else.
    """
    if priority is None:
        return
    if isinstance(priority, bool) or not isinstance(priority, (int, float, np.number)):
        raise InvalidArgumentError(
            f"priority={describe(priority)} must be a number >= 0, or None for each table's default"
        )
    check_priorities(priority, 1, "priority")


def sequence_rules(sequence_tables: Mapping[Any, Any] | None) -> list[tuple[Any, SequenceItems]]:
    """``sequence_tables`` as ``(table, rule)`` pairs, each rule the adder's own copy (a
    rule holds per-environment positions, so adders never share one).

    Raises:
        InvalidArgumentError: for a value that is not a :class:`SequenceItems`.
    """
    rules = [(t, copy.copy(r)) for t, r in (sequence_tables or {}).items()]
    for _, rule in rules:
        if not isinstance(rule, SequenceItems):
            raise InvalidArgumentError(
                f"sequence_tables values must be SequenceItems(length, period, ...), got "
                f"{describe(rule)}"
            )
    return rules


@dataclass(frozen=True)
class AdderOptions:
    """An adder's options once checked, and the row capacity they imply.

    Attributes:
        num_envs: environments per call (1 without a batch axis).
        batched: whether inputs carry a batch axis (``num_envs`` was given).
        mode: the autoreset mode's name.
        chunk_length: rows buffered per environment before they are handed over.
        priority: priority of new items (``None``: each table's default).
        timeout: seconds each writer call may wait (``None``: no limit).
        every: adder calls completed rows are staged for before they are handed over.
        capacity: rows each environment's buffer holds: the rows an item may reach back
            to (``fixed``) plus a chunk.
    """

    num_envs: int
    batched: bool
    mode: str
    chunk_length: int
    priority: float | None
    timeout: float | None
    every: int
    capacity: int

    @classmethod
    def check(
        cls,
        *,
        fixed: int,
        store_capacity: int | None,
        num_envs: Any,
        autoreset_mode: Any,
        priority: Any,
        chunk_length: Any,
        timeout: Any,
        hand_over_every: Any,
    ) -> AdderOptions:
        """The options checked, ``chunk_length`` defaulted to what the store leaves.

        Args:
            fixed: rows a buffer needs besides a chunk (items' span, lag, padding).
            store_capacity: the store's rows when it is known locally (``None``: remote).
            num_envs, autoreset_mode, priority, chunk_length, timeout, hand_over_every:
                as :class:`~rlreplay.writers.stream.StreamAdder` takes them.

        Raises:
            InvalidArgumentError: for the first option that is out of its range.
        """
        if chunk_length is None:
            room = DEFAULT_CHUNK_LENGTH if store_capacity is None else store_capacity - fixed
            chunk_length = max(1, min(DEFAULT_CHUNK_LENGTH, room))
        chunk_length = check_count(chunk_length, "chunk_length")
        if num_envs is not None:
            num_envs = check_count(num_envs, "num_envs", "None: one env without a batch axis")
        check_priority(priority)
        timeout = check_timeout(timeout)
        every = check_every(hand_over_every, num_envs is not None)
        return cls(
            num_envs=num_envs or 1,
            batched=num_envs is not None,
            mode=mode_name(autoreset_mode),
            chunk_length=chunk_length,
            priority=priority,
            timeout=timeout,
            every=every,
            capacity=fixed + chunk_length,
        )
