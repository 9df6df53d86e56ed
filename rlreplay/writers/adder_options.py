"""The options every stream adder takes, checked and sized before any part is built.

They are all checked before the adder builds its writer, buffers or hand-over, so a bad
option changes nothing (:class:`AdderOptions`). :func:`adder_writer` takes a writer, or
tables to create a :class:`~rlreplay.writers.trajectory_writer.TrajectoryWriter` over.
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


# A created writer retains at most 1/_HISTORY_SHARE of its store beyond the adder's capacity.
_HISTORY_SHARE = 32


def adder_writer(writer: Any, capacity: int, wanted: int | None = None) -> Writer:
    """``writer`` itself, or a :class:`TrajectoryWriter` over the given tables retaining the
    ``capacity`` rows the adder reaches back to (up to ``wanted``, within 1/32 of the store);
    InvalidArgumentError if the store or history is shorter than ``capacity``."""
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
    """The step signature of a writer (:class:`~rlreplay.runtime.interfaces.Writer`) or tables;
    InvalidArgumentError for anything else."""
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
    """The layout span of ``table`` (a table, or the name or handle of one of the writer's)."""
    if isinstance(table, Table):
        return table.layout.span
    name = getattr(table, "name", table)
    return next(t.layout.span for t in writer.tables if t.name == name)


def check_tables(writer: Writer, tables: list[Any]) -> None:
    """Check that every table (or name) is one of the writer's (else InvalidArgumentError)."""
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
    """The tables an adder fills with its own items: ``tables``, or (``None``) every writer table
    not in ``sequence_tables``; InvalidArgumentError for none, or one not the writer's."""
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
    """Check an item priority: a number >= 0, or ``None`` (else InvalidArgumentError)."""
    if priority is None:
        return
    if isinstance(priority, bool) or not isinstance(priority, (int, float, np.number)):
        raise InvalidArgumentError(
            f"priority={describe(priority)} must be a number >= 0, or None for each table's default"
        )
    check_priorities(priority, 1, "priority")


def sequence_rules(sequence_tables: Mapping[Any, Any] | None) -> list[tuple[Any, SequenceItems]]:
    """``sequence_tables`` as ``(table, rule)`` pairs, each rule the adder's own copy (a rule
    holds per-environment positions, so adders never share one)."""
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
        batched: whether inputs carry a batch axis.
        mode: the autoreset mode's name.
        chunk_length: rows buffered per environment before they are handed over.
        priority: priority of new items (``None``: each table's default).
        timeout: seconds each writer call may wait (``None``: no limit).
        every: adder calls completed rows are staged for.
        capacity: rows each environment's buffer holds (``fixed`` plus a chunk).
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
        """The options checked (InvalidArgumentError for the first out of range), ``chunk_length``
        defaulted to what the store leaves.

        Args:
            fixed: rows a buffer needs besides a chunk (items' span, lag, padding).
            store_capacity: the store's rows when known locally (``None``: remote).
            num_envs, autoreset_mode, priority, chunk_length, timeout, hand_over_every:
                as :class:`~rlreplay.writers.stream.StreamAdder` takes them.
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
