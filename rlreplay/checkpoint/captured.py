"""What a checkpoint's capture took: every part's state at the checkpoint's moment.

A :class:`Snapshot` holds, per store, its definition, bookkeeping and the column stream
installed at the moment (:class:`StoreSnapshot`), and per table its definition and its
parts' states (:class:`TableSnapshot`), as :class:`~rlreplay.checkpoint.snapshot.Capture`
took them; :func:`~rlreplay.checkpoint.save.save` writes it. :func:`as_tables` checks the
tables a save or a restore is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlreplay.checkpoint.increments import Previous
from rlreplay.checkpoint.state_files import StateStream
from rlreplay.checkpoint.streaming import ColumnStream
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, describe


def as_tables(tables: Table | Sequence[Table] | Mapping[str, Table]) -> list[Table]:
    """``tables`` as a list of distinct tables with distinct names.

    Raises:
        InvalidArgumentError: for an empty or malformed argument, or two tables sharing a
            name (a checkpoint names its tables).
    """
    if isinstance(tables, Table):
        items = [tables]
    elif isinstance(tables, Mapping):
        items = list(tables.values())
    elif isinstance(tables, Sequence) and not isinstance(tables, (str, bytes)):
        items = list(tables)
    else:
        items = None
    if not items or not all(isinstance(t, Table) for t in items):
        raise InvalidArgumentError(
            f"tables={describe(tables)} must be a Table, or a non-empty list or dict of Tables"
        )
    names = [t.name for t in items]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidArgumentError(
            f"tables holds several tables named {dupes}; a checkpoint tells tables apart by "
            "name, so give each table its own name"
        )
    return items


@dataclass
class StoreSnapshot:
    """One store at the checkpoint's moment: definition, bookkeeping, column stream."""

    store: StepStore
    definition: dict[str, Any]
    state: dict[str, Any]
    stream: ColumnStream
    column_files: dict[str, list[str]]  # field path to its chunk files' names
    increments: dict[str, Any]  # the store's identity and write generation at the moment
    previous: Previous | None = None  # the newest checkpoint's copy of this store
    reusable: np.ndarray | None = None  # chunks unchanged since ``previous``


@dataclass
class TableSnapshot:
    """One table at the checkpoint's moment."""

    table: Table
    store: int  # index into the snapshot's stores
    definition: dict[str, Any]
    state: dict[str, Any]


@dataclass
class Snapshot:
    """Every part's state at the checkpoint's moment (one moment per store)."""

    stores: list[StoreSnapshot] = field(default_factory=list)
    tables: list[TableSnapshot] = field(default_factory=list)
    created_unix: float = 0.0
    held_s: float = 0.0  # the longest lock hold of the capture, in seconds
    # the per-item state written into files by the capture, finished by finish()
    state_streams: list[StateStream] = field(default_factory=list)

    def finish(self) -> dict[str, dict[str, Any]]:
        """Finish the files the capture wrote the per-item state of large indexes into
        (the changes of the moment applied, checksums, fsync): after the moment, in the
        save's own thread. Returns their manifest entries by file name.

        Raises:
            OSError: if a write failed.
        """
        entries: dict[str, dict[str, Any]] = {}
        for stream in self.state_streams:
            entries.update(stream.finish())
        return entries

    @property
    def state_peak_bytes(self) -> int:
        """The most bytes of per-item state the state streams held in memory at once."""
        return sum(s.peak_bytes for s in self.state_streams)

    def release(self) -> None:
        """Take the column streams off their stores (after streaming, or on failure) and
        close the state streams' files."""
        for s in self.stores:
            with s.store.mutex:
                if s.store.guard is s.stream:
                    s.store.guard = None
        for stream in self.state_streams:
            stream.close()
