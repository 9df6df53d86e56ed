"""The item index's checkpoint state: a snapshot of every part of it, checked and restored.

An :class:`~rlreplay.core.item_index.ItemIndex`'s state is its per-slot records (see
:class:`~rlreplay.core.slot_records.SlotRecords`), its size, counters, largest priority,
generation origin and newest slot, and both selectors' states. These functions make that
snapshot (with the table's lock held, copying into buffers made before it was taken) and
check one before it is put back; a remover left idle keeps no state: a checkpoint leaves
it out (``None``), and :func:`idle_remover_state` makes it from a snapshot where one is
asked for, after the lock is released. They read the index, never change it: the
index puts a checked state back itself (:meth:`~rlreplay.core.item_index.ItemIndex.
load_state`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.core import idle_remover
from rlreplay.core.keys import GENERATIONS
from rlreplay.core.selectors.base import Selector
from rlreplay.core.slot_changes import UNTRACKED, SlotChanges, sorted_unique
from rlreplay.errors import InvalidArgumentError

if TYPE_CHECKING:
    from rlreplay.core.item_index import ItemIndex


def snapshot(
    index: ItemIndex, into: dict[str, Any] | None, idle_remover_later: bool
) -> dict[str, Any]:
    """The state of ``index`` (copies; lock held); see :meth:`ItemIndex.state`."""
    into = into or {}
    out: dict[str, Any] = index.records.state(into)
    extent = out.pop("extent", None)
    out.update(_index_scalars(index, into, None, idle_remover_later))
    if extent is not None:  # last, as the index has always listed it
        out["extent"] = extent
    return out


def _index_scalars(
    index: ItemIndex, into: dict[str, Any], sampler: Any, idle_remover_later: bool
) -> dict[str, Any]:
    """The index's state beside its per-slot arrays, taken now (lock held): sizes,
    counters, the sampler's state (``sampler`` if already copied in slices) and the
    remover's (None for an idle remover built later from the copy)."""
    return {
        "size": index.size,
        "max_priority": index.max_priority,
        "origin": index.origin,
        "newest": index.newest,
        "counts": dict(index.counts),
        "sampler": sampler if sampler is not None else index.sampler.state(into.get("sampler")),
        "remover": (
            None
            if idle_remover_later and not index.remover_active
            else remover_state(index, into.get("remover"))
        ),
    }


# A part of a sliced snapshot with at most this many entries is copied whole at the moment
# (the top levels of a sum tree, which some updates recompute whole).
WHOLE_ENTRIES = 1 << 16


def start_sliced_snapshot(index: ItemIndex, into: dict[str, Any] | None) -> tuple[dict, list]:
    """The first step of a snapshot taken in slices (lock held): the state's per-slot
    arrays, not filled yet (records, live flags, extents and, where the sampler offers
    them, its arrays: see :meth:`Selector.state_parts`), and the parts that fill them,
    ``(array, its copy, slots per entry)``. From now on the index notes the slots its
    mutations change. The caller copies the parts, a slice per lock hold, then calls
    :func:`finish_sliced_snapshot` with the lock held (the moment), or
    :func:`abandon_sliced_snapshot`. (Arrays missing from ``into`` are made empty: they
    take no memory until written, so a caller that writes the slices elsewhere, into
    files, may use them only to see where each part's entries go.)"""
    into = into or {}
    out, parts = index.records.state_parts(into)
    sampler = index.sampler.state_parts(into.get("sampler"))
    if sampler is not None:
        out["sampler"], more = sampler
        parts = parts + more
    index.changes = SlotChanges(index.capacity)
    return out, parts


def take_changes(index: ItemIndex) -> np.ndarray | None:
    """The slots changed since :func:`start_sliced_snapshot`, sorted, each once, or
    ``None`` when every slot may have changed (a reset or a restore); the index stops
    noting changes (lock held)."""
    changes, index.changes = index.changes, UNTRACKED
    return None if not changes.tracking or changes.everything else changes.slots()


def part_entries(slots: np.ndarray, per_entry: int) -> np.ndarray:
    """The entries of a part (``per_entry`` slots each) that ``slots`` (sorted) change."""
    return slots if per_entry == 1 else sorted_unique(slots // per_entry)


def copied_whole(source: np.ndarray, slots: np.ndarray | None) -> bool:
    """Whether the moment copies this part whole: after a reset or a restore, or for a
    part of at most ``WHOLE_ENTRIES`` entries."""
    return slots is None or len(source) <= WHOLE_ENTRIES


def finish_sliced_snapshot(
    index: ItemIndex,
    out: dict[str, Any],
    parts: list[tuple],
    into: dict[str, Any] | None,
    idle_remover_later: bool,
) -> dict[str, Any]:
    """The snapshot's moment (lock held): the entries of the parts that the slots changed
    since :func:`start_sliced_snapshot` are copied again (small parts whole; every
    part whole after a reset or a restore), and the rest of the state is taken as
    :func:`snapshot` takes it. Returns what :func:`snapshot` would return now."""
    slots = take_changes(index)
    for source, copy, per_entry in parts:
        if copied_whole(source, slots):
            np.copyto(copy, source)
        elif len(slots):
            at = part_entries(slots, per_entry)
            copy[at] = source[at]
    return finish_scalars(index, out, into, idle_remover_later)


def finish_scalars(
    index: ItemIndex, out: dict[str, Any], into: dict[str, Any] | None, idle_remover_later: bool
) -> dict[str, Any]:
    """Complete a sliced snapshot's ``out`` (its per-slot parts taken) with the rest of
    the state, taken now as :func:`snapshot` takes it (lock held)."""
    sampler = out.pop("sampler", None)
    extent = out.pop("extent", None)
    out.update(_index_scalars(index, into or {}, sampler, idle_remover_later))
    if extent is not None:  # last, as the index has always listed it
        out["extent"] = extent
    return out


def abandon_sliced_snapshot(index: ItemIndex) -> None:
    """Stop noting changes for a sliced snapshot that will not finish (lock held)."""
    index.changes = UNTRACKED


def snapshot_buffers(index: ItemIndex) -> dict[str, Any]:
    """Arrays :func:`snapshot` can copy into, made (and written once) outside the
    table's lock; see :meth:`Selector.state_buffers`."""
    out = index.records.state_buffers()
    out["sampler"] = index.sampler.state_buffers()
    if index.remover_active:  # (an idle remover's state is made, not copied: no buffers)
        out["remover"] = index.remover.state_buffers()
    return out


def offers_parts(selector: Any) -> bool:
    """Whether ``selector`` offers its state as parts (:meth:`Selector.state_parts`)."""
    return type(selector).state_parts is not Selector.state_parts


def moment_buffers(index: ItemIndex) -> dict[str, Any]:
    """Arrays for what the moment of a sliced snapshot copies whole (lock held), made
    outside the lock: the sampler's state where the sampler offers no parts, an active
    remover's state (an idle remover's is not taken: see :func:`_index_scalars`)."""
    out: dict[str, Any] = {}
    if not offers_parts(index.sampler):
        out["sampler"] = index.sampler.state_buffers()
    if index.remover_active:
        out["remover"] = index.remover.state_buffers()
    return out


def check(index: ItemIndex, state: dict[str, Any]) -> int:
    """Check that ``state`` fits ``index`` (arrays of one entry per slot, live flags that
    agree with the size, an origin in range); returns its size.

    Raises:
        InvalidArgumentError: naming what does not fit, the sampler's and an active
            remover's states included.
    """
    index.records.check_state(state)
    index.sampler.check_state(state["sampler"])
    if index.remover_active:  # an idle remover keeps no state to load
        index.remover.check_state(state["remover"])
    size = int(state["size"])
    live = int(np.count_nonzero(state["live"]))
    if live != size or not 0 <= state["origin"] < GENERATIONS:
        raise InvalidArgumentError(
            f"item state holds {live} live slots but size={size}, or "
            f"origin={state['origin']} is out of range: it is not an index's state"
        )
    return size


def remover_state(index: ItemIndex, into: dict[str, Any] | None) -> dict[str, Any]:
    """The remover's state; an idle remover's is made now, holding the items in
    :func:`~rlreplay.core.idle_remover.idle_order`."""
    if index.remover_active:
        return index.remover.state(into)
    return idle_remover.idle_state(index.remover, index.live, index.newest, index.priority, into)


def idle_remover_state(
    index: ItemIndex, state: dict[str, Any], into: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The idle remover's state for a snapshot taken with ``idle_remover_later=True``,
    made from the snapshot's own arrays (no lock needed: it reads nothing of the live
    index)."""
    return idle_remover.idle_state(
        index.remover, state["live"], state["newest"], state["priority"], into
    )
