"""What a table holds, read out in step order: a range of stored steps and the items on it.

The dataset formats (``columnar``, ``minari_format``) read a store's steps and a table's
items through this module, each read one vectorised copy taken with the store's lock
held, so a consistent snapshot is read while writers and samplers go on (they wait only
for the copy). Nothing here changes a table or a store.

A *range* of a store is given by step ids, the store's insert counts: step ``i`` is the
``i``-th step ever appended, so ``first_id``/``end_id`` select the steps inserted between
two moments a user noted ``store.next_id``. The store keeps no insertion times; to export
by wall-clock time, store a time column and select with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlreplay.core.gather import gather_variable
from rlreplay.core.keys import make_keys
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, describe

__all__ = ["ItemRecords", "StepRange", "read_items", "read_steps", "step_range"]


@dataclass(frozen=True)
class StepRange:
    """Stored step ids ``[first_id, end_id)`` of one store (both multiples of its lanes)."""

    first_id: int
    end_id: int

    @property
    def size(self) -> int:
        return self.end_id - self.first_id


@dataclass(frozen=True)
class ItemRecords:
    """A table's items whose every step lies in a range, ordered by anchor step id.

    Attributes:
        anchor_ids: int64 step id of each item's anchor (its oldest step).
        extents: int64 steps each item covers (the layout's span for fixed layouts).
        keys: int64 keys the table issued for them.
        priorities: float64 priorities.
        times_sampled: uint32 times each was sampled.
        data: the items' layout outputs (``[n, ...]`` per output field) when asked for.
    """

    anchor_ids: np.ndarray
    extents: np.ndarray
    keys: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    data: dict[str, np.ndarray] | None = None


def _check_id(name: str, value: object, lo: int, hi: int, lanes: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name}={describe(value)} must be an int step id")
    value = int(value)
    if not lo <= value <= hi or value % lanes:
        raise InvalidArgumentError(
            f"{name}={value} must be a step id in the stored range [{lo}, {hi}] (the store's "
            f"oldest_id and next_id) and a multiple of lanes={lanes}; steps before "
            f"{lo} were overwritten"
        )
    return value


def step_range(store: StepStore, first_id: int | None, end_id: int | None) -> StepRange:
    """The range ``[first_id, end_id)`` of ``store``'s stored steps (lock held or not: a
    later read checks again); ``None`` stands for the oldest stored step and for the next
    id to be appended.

    Raises:
        InvalidArgumentError: for an id outside the stored range, not a multiple of the
            store's lanes, or ``first_id > end_id``.
    """
    with store.mutex:
        lo, hi = store.oldest_id, store.next_id
    first = lo if first_id is None else _check_id("first_id", first_id, lo, hi, store.lanes)
    end = hi if end_id is None else _check_id("end_id", end_id, lo, hi, store.lanes)
    if first > end:
        raise InvalidArgumentError(
            f"first_id={first} is after end_id={end}; give first_id <= end_id"
        )
    return StepRange(first, end)


def read_steps(store: StepStore, span: StepRange) -> dict[str, np.ndarray]:
    """Copies of the steps ``span`` selects, field path to ``[n, ...]`` array in id order.

    Raises:
        InvalidArgumentError: if some of them were overwritten since ``span`` was made.
    """
    with store.mutex:
        _check_still_stored(store, span)
        rows = np.arange(span.first_id, span.end_id, dtype=np.int64) % store.capacity
        return store.read_rows(rows)


def read_items(table: Table, span: StepRange, with_data: bool = False) -> ItemRecords:
    """The items of ``table`` whose every step lies in ``span``, oldest anchor first.

    Args:
        table: the table.
        span: a range of its store's steps (:func:`step_range`).
        with_data: also read each item's layout outputs (what a sample of it returns).

    Raises:
        InvalidArgumentError: if steps of ``span`` were overwritten since it was made.
    """
    store, index = table.store, table.index
    with store.mutex:
        _check_still_stored(store, span)
        cap, lanes = store.capacity, store.lanes
        slots = np.flatnonzero(index.live).astype(np.int64)
        oldest = store.oldest_id
        anchors = oldest + (slots - oldest) % cap
        extents = index.spans(slots)
        last = anchors + (extents - 1) * lanes
        keep = (anchors >= span.first_id) & (last < span.end_id)
        order = np.argsort(anchors[keep], kind="stable")
        slots, anchors, extents = slots[keep][order], anchors[keep][order], extents[keep][order]
        data = None
        if with_data:
            data = gather_variable(store, table.layout, slots, extents)
            data = {name: np.array(arr) for name, arr in data.items()}
        return ItemRecords(
            anchor_ids=anchors,
            extents=extents,
            keys=make_keys(slots, index.generation[slots], index.origin),
            priorities=index.priority[slots].copy(),
            times_sampled=index.times_sampled[slots].copy(),
            data=data,
        )


def _check_still_stored(store: StepStore, span: StepRange) -> None:
    if span.first_id < store.oldest_id or span.end_id > store.next_id:
        raise InvalidArgumentError(
            f"steps [{span.first_id}, {span.end_id}) are no longer all stored (the store now "
            f"holds [{store.oldest_id}, {store.next_id})); choose the range again"
        )
