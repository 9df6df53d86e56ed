"""What a table holds, read out in step order: a range of stored steps and the items on it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TypeVar

import numpy as np

from rlreplay.core.gather import gather_variable
from rlreplay.core.keys import make_keys
from rlreplay.core.layout import ItemLayout
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, describe

__all__ = ["ItemRecords", "StepRange", "item_data", "read_items", "read_steps", "step_range"]

CHUNK_BYTES = 4 << 20  # the most step bytes one lock hold copies
T = TypeVar("T")


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
        extents: int64 steps each item covers.
        keys: int64 keys the table issued for them.
        priorities: float64 priorities.
        times_sampled: uint32 times each was sampled.
    """

    anchor_ids: np.ndarray
    extents: np.ndarray
    keys: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray


def _check_id(name: str, value: object, lo: int, hi: int, lanes: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name}={describe(value)} must be an int step id")
    value = int(value)
    if not lo <= value <= hi or value % lanes:
        overwritten = f"; steps before {lo} were overwritten" if lo else ""
        raise InvalidArgumentError(
            f"{name}={value} must be a step id in the stored range [{lo}, {hi}] (the store's "
            f"oldest_id and next_id) and a multiple of lanes={lanes}{overwritten}"
        )
    return value


def step_range(store: StepStore, first_id: int | None, end_id: int | None) -> StepRange:
    """The range ``[first_id, end_id)`` of ``store``'s stored steps (``None``: oldest, next id).

    Raises:
        InvalidArgumentError: for an id not stored or not a multiple of lanes, or a reversed
            range.
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


def read_steps(
    store: StepStore,
    first_id: int | None = None,
    end_id: int | None = None,
    fields: Sequence[str] | None = None,
    first_hold: Callable[[StepRange], T] | None = None,
) -> tuple[StepRange, dict[str, np.ndarray], T | None]:
    """Copies of the steps ``[first_id, end_id)`` (:func:`step_range`), one snapshot.

    Copied a chunk of about ``CHUNK_BYTES`` per lock hold, so writers wait for one chunk only.

    Args:
        store: the store.
        first_id, end_id: the range (``None``: the oldest stored step, the next id).
        fields: the field paths to copy (default: all).
        first_hold: called with the range in the first lock hold; its result is returned.

    Returns:
        ``(span, steps, first_hold(span))``: the range, field path to ``[n, ...]`` array
        in id order, and ``first_hold``'s result (``None`` without it).

    Raises:
        InvalidArgumentError: for a bad range, or if steps not yet copied were overwritten
            (export a newer range, or pause the writers).
    """
    paths = list(store.columns) if fields is None else list(fields)
    row_bytes = max(1, sum(store.columns[p][:1].nbytes for p in paths))
    chunk = max(store.lanes, CHUNK_BYTES // row_bytes // store.lanes * store.lanes)
    with store.mutex:
        span = step_range(store, first_id, end_id)
        extra = None if first_hold is None else first_hold(span)
        out = {
            p: np.empty((span.size, *store.columns[p].shape[1:]), store.columns[p].dtype)
            for p in paths
        }
        lo = _copy_chunk(store, span, paths, out, 0, chunk)
    while lo < span.size:
        with store.mutex:
            _check_still_stored(store, StepRange(span.first_id + lo, span.end_id))
            lo = _copy_chunk(store, span, paths, out, lo, chunk)
    return span, out, extra


def _copy_chunk(
    store: StepStore,
    span: StepRange,
    paths: list[str],
    out: dict[str, np.ndarray],
    lo: int,
    chunk: int,
) -> int:
    """Copy rows ``[lo, lo + chunk)`` of ``span`` into ``out`` (lock held); returns the end."""
    hi = min(span.size, lo + chunk)
    start = (span.first_id + lo) % store.capacity
    split = min(hi - lo, store.capacity - start)  # rows before the ring wraps
    for p in paths:
        col, dst = store.columns[p], out[p]
        dst[lo : lo + split] = col[start : start + split]
        dst[lo + split : hi] = col[: hi - lo - split]
    return hi


def item_data(
    layout: ItemLayout,
    steps: Mapping[str, np.ndarray],
    lanes: int,
    records: ItemRecords,
    first_id: int,
) -> dict[str, np.ndarray]:
    """The layout outputs of ``records``' items, read from ``steps`` (a copy from ``first_id``)."""
    n = len(next(iter(steps.values())))
    copy = SimpleNamespace(columns=steps, lanes=lanes, capacity=max(n, 1))
    anchors = records.anchor_ids - first_id  # rows of the copy: no wrap-around
    return gather_variable(copy, layout, anchors, records.extents)  # type: ignore[arg-type]


def read_items(table: Table, span: StepRange) -> ItemRecords:
    """The items of ``table`` whose every step lies in ``span``, oldest anchor first.

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
        return ItemRecords(
            anchor_ids=anchors,
            extents=extents,
            keys=make_keys(slots, index.generation[slots], index.origin),
            priorities=index.priority[slots].copy(),
            times_sampled=index.times_sampled[slots].copy(),
        )


def _check_still_stored(store: StepStore, span: StepRange) -> None:
    if span.first_id < store.oldest_id or span.end_id > store.next_id:
        raise InvalidArgumentError(
            f"steps [{span.first_id}, {span.end_id}) are no longer all stored (the store now "
            f"holds [{store.oldest_id}, {store.next_id})); choose the range again"
        )
