"""The item index: a table's items, one per anchor slot, and the state that goes with them.

A table holds at most one item per anchor step, in the slot equal to the anchor's row in
the step store. :class:`ItemIndex` owns everything per slot (a record of generation,
times sampled and, where a selector uses priorities, the priority: 16 bytes, or 8; the
live flag; the item's extent for layouts with per-item extents), the sampler and the
remover (the selectors) and the table's size and counters, and keeps them in agreement:
every method leaves ``size``, the live flags and both selectors consistent, or raises
before changing anything. The table calls it with its lock held; the overwrite protocol
(overwrite.py) calls :meth:`ItemIndex.evict_rows`, :meth:`~ItemIndex.detach_for_move`
and :meth:`~ItemIndex.attach_moved` for rows the store is about to overwrite.

Its parts: the per-slot arrays and their layout are a
:class:`~rlreplay.core.slot_records.SlotRecords` it owns (they write the records of new
and moved items, a batch in one compiled pass), the lookup of the items keys name is
:mod:`rlreplay.core.held_keys`; its checkpoint state (whole, or in slices while the slots
changed meanwhile are noted: :mod:`rlreplay.core.slot_changes`) is made, checked and put
back here. The compiled loops of ``_slots.c`` are bound here
(``_kernel``, handed to the records and the lookup; ``None`` without a compiler: the
numpy twins).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core import held_keys, idle_remover
from rlreplay.core._compiled import load_kernel
from rlreplay.core.keys import GENERATIONS
from rlreplay.core.selectors import Selector
from rlreplay.core.slot_changes import UNTRACKED, SlotChanges, Untracked
from rlreplay.core.slot_records import (  # noqa: F401 (the record layout, named here too)
    SLOT_STATE,
    SLOT_STATE_UNPRIORITIZED,
    UNKEPT_PRIORITY,
    SlotRecords,
    keeps_priorities,
    slot_record_dtype,
)
from rlreplay.errors import InvalidArgumentError, describe

_kernel = load_kernel("rlreplay.core._slots")

COUNTERS = (
    "deletes",
    "evictions",
    "overwrite_evictions",
    "relocations",
    "stale_updates",
    "stale_deletes",
    "sampled_items",
)
# Counted since creation but for ``sampled_items`` (items drawn at least once), which a
# reset zeroes as it zeroes the rate limiter's counts (Reverb's num_unique_samples).


class ItemIndex:
    """A table's items by slot, with the sampler, the remover, the size and counters.

    Args:
        capacity: slots (the store's capacity: one per stored row).
        sampler, remover: the table's selectors (bound here to ``capacity`` slots).
        max_size: most items held; inserts beyond it evict the remover's choice.
        span: the layout's span (the steps an item reads).
        variable: whether items have per-item extents (``from_end``/``pad`` windows).
        default_priority: priority of items inserted without one (``None``: the largest
            priority seen so far, 1.0 at first).
        rng: the table's random generator (victims of random removers).
        origin: the table's generation origin (0 .. 2**31 - 2, see keys.py): the keys of
            its items carry their generations moved by it, so that another table's keys
            are refused as not this table's.

    Attributes (read by the table and the draws; changed only through the methods):
        size, live, priority, generation, times_sampled, slot_bytes, extent, counts,
        max_priority, origin, keeps_priorities, remover_active; ``live_in`` and
        ``any_live_in`` are :class:`~rlreplay.core.slot_records.SlotRecords`'
        (slots holding items among a range of rows, and whether any does).

    Remover: a table whose ``max_size`` reaches ``capacity`` never asks its remover for
    victims (see :mod:`rlreplay.core.idle_remover`): the remover is left unbound and idle
    (``remover_active`` False), costing no memory and no work per insert.

    Priorities: when neither selector uses them (``Uniform``, ``Fifo``, ``Lifo``), the
    index keeps none (its records take 8 bytes per slot, not 16): priorities given to
    inserts and updates are checked, then dropped, and every item's priority reads as
    :data:`UNKEPT_PRIORITY` (``priority`` is then a read-only array of it).
    """

    def __init__(
        self,
        capacity: int,
        sampler: Selector,
        remover: Selector,
        max_size: int,
        span: int,
        variable: bool,
        default_priority: float | None,
        rng: np.random.Generator,
        origin: int = 0,
    ):
        if not 0 <= origin < GENERATIONS:
            raise ValueError(f"origin={origin} must be in 0 .. 2**31 - 2")
        self.origin = origin
        self.capacity = capacity
        self.sampler = sampler
        self.remover = remover
        self.max_size = max_size
        self.span = span
        self.default_priority = default_priority
        self.rng = rng
        # The per-slot arrays are the records' (written in place, never replaced); the
        # index holds references to them so its calls reach them with no indirection.
        self.records = records = SlotRecords(
            capacity, slot_record_dtype(sampler, remover), variable
        )
        self.keeps_priorities = records.keeps_priorities
        self.slot_state, self.slot_bytes = records.slot_state, records.slot_bytes
        self.priority, self.generation = records.priority, records.generation
        self.times_sampled = records.times_sampled
        self.live, self.extent = records.live, records.extent
        # The records' queries of the live flags, bound here (the overwrite protocol calls
        # ``index.live_in`` / ``index.any_live_in`` for the rows it is about to overwrite).
        self.live_in, self.any_live_in = records.live_in, records.any_live_in
        sampler.bind(capacity)
        self.remover_active = not idle_remover.remover_is_idle(capacity, max_size)
        # The remover's calls go to ``_remover``: None while it is idle.
        self._remover = remover if self.remover_active else None
        if self._remover is not None:
            remover.bind(capacity)
        # The largest priority the selectors in use take (see Selector.max_priority).
        self.priority_cap = min(
            sampler.max_priority, remover.max_priority if self.remover_active else float("inf")
        )
        self._newest = capacity - 1  # the slot of the item inserted last (idle order)
        self.size = 0
        self.max_priority = 1.0
        self.counts = dict.fromkeys(COUNTERS, 0)
        # While a checkpoint copies the per-slot state in slices: the slots each mutation
        # below changes are noted here; else notes go nowhere (rlreplay.core.slot_changes).
        self.changes: SlotChanges | Untracked = UNTRACKED

    # --------------------------------------------------------------- creation
    def check_priority_range(self, prios: np.ndarray | None, argument: str = "priorities") -> None:
        """Refuse priorities (checked finite and >= 0) beyond what the selectors take.

        Raises:
            InvalidArgumentError: naming the largest, the cap and why.
        """
        if prios is None or not len(prios) or self.priority_cap == float("inf"):
            return
        top = float(prios.max())
        if top > self.priority_cap:
            capped = self.sampler
            if self._remover is not None and self._remover.max_priority < capped.max_priority:
                capped = self._remover
            raise InvalidArgumentError(
                f"{argument} contains {top:.6g}, beyond the largest this table takes "
                f"({self.priority_cap:.6g}): its {capped!r} raises priorities to its "
                f"exponent and sums them over {self.capacity} slots in float64, which would "
                "overflow; scale the priorities down (e.g. abs(td_error) + 1e-6)"
            )

    def _make_room_for(self, n: int) -> None:
        """Evict the remover's choice so that ``n`` more items fit ``max_size``."""
        excess = self.size + n - self.max_size
        if excess > 0:
            victims = self.remover.choose_victims(excess, self.rng)
            self._drop(np.asarray(victims, dtype=np.int64))  # held items: the remover's
            self.counts["evictions"] += len(victims)

    def claim(
        self, slots: np.ndarray, prios: np.ndarray | None, start: int | None = None
    ) -> np.ndarray:
        """Make new items at ``slots`` (distinct; ``slots == arange(start, start + n)`` when
        ``start`` is given, which lets per-slot state be written through slices); returns
        their keys.

        Items this table holds on those slots are the ones whose rows the caller has
        just rewritten: they are overwritten (counted as overwrite evictions), and when
        all of them are, the new items take over their selector entries.
        """
        n = len(slots)
        fill = self.default_priority
        fill = self.max_priority if fill is None else float(fill)
        self.changes.note(slots)
        if prios is not None:
            self.max_priority = max(self.max_priority, float(prios.max()))
        # Every slot holds an item when the index is full (a full ring's rows): no count.
        if self.size == self.capacity:
            held = n
        else:
            at = slots if start is None else slice(start, start + n)
            held = int(np.count_nonzero(self.live[at]))
        replacing = held == n
        if replacing:
            self.counts["overwrite_evictions"] += n
        else:
            if held:
                self.evict_slots(slots[self.live[at]])
            self._make_room_for(n)
        keys, prios = self.records.claim(_kernel, slots, prios, fill, self.origin, start)
        remover = self._remover
        if replacing:
            self.sampler.replace(slots, prios)
            if remover is not None:
                remover.replace(slots, prios)
        else:
            self.sampler.insert(slots, prios)
            if remover is not None:
                remover.insert(slots, prios)
            self.size += n
        self._newest = int(slots[-1]) if start is None else start + n - 1
        return keys

    # ---------------------------------------------------------------- removal
    def remove(self, slots: np.ndarray) -> None:
        """Remove the held items at ``slots`` (distinct).

        Raises:
            InvalidArgumentError: if a slot is out of range or holds no item; nothing
                changes then (the check comes before any change, and the changes after
                it cannot fail, so removal never stops halfway).
        """
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) == 0:
            return
        if slots.min() < 0 or slots.max() >= self.capacity or not self.live[slots].all():
            raise InvalidArgumentError(
                f"slots {describe(slots[:8].tolist())} do not all hold items; nothing was removed"
            )
        self._drop(slots)

    def _drop(self, slots: np.ndarray) -> None:
        """:meth:`remove` without its checks: ``slots`` (int64, distinct) all hold items."""
        self.changes.note(slots)
        self.sampler.delete(slots)
        if self._remover is not None:
            self._remover.delete(slots)
        self.live[slots] = False
        self.size -= len(slots)

    def evict_slots(self, slots: np.ndarray) -> None:
        """Remove held items whose rows are overwritten (counted as overwrite evictions).

        ``slots`` (int64, distinct) must all hold items: the callers take them from
        :attr:`live`, so they are not checked again.
        """
        self._drop(slots)
        self.counts["overwrite_evictions"] += len(slots)

    def evict_rows(self, start: int, n: int) -> None:
        """Remove the items anchored on rows ``[start, start + n)`` (wrapping), which the
        store is about to overwrite."""
        if n <= 0 or self.size == 0:
            return
        doomed = self.live_in(start, n)
        if len(doomed):
            self.evict_slots(doomed)

    # -------------------------------------------------------------- relocation
    def spans(self, slots: np.ndarray) -> np.ndarray:
        """Steps each item at ``slots`` reads (its extent, or the layout's span)."""
        if self.extent is not None:
            return self.extent[slots].astype(np.int64)
        return np.full(len(slots), self.span, dtype=np.int64)

    def detach_for_move(self, slot: int) -> tuple[int, tuple[float, int, int]]:
        """Take the item at ``slot`` off its row, which is about to be overwritten, keeping
        its selector entries for :meth:`attach_moved`; returns ``(span, state)``."""
        span = int(self.spans(np.array([slot]))[0])
        state = (float(self.priority[slot]), int(self.times_sampled[slot]), span)
        self.changes.note(np.array([slot]))
        self.live[slot] = False
        return span, state

    def attach_moved(self, old: int, new: int, state: tuple[float, int, int]) -> None:
        """The item taken off ``old`` now lives at ``new``, where its steps were copied:
        same priority, times sampled and place in the selectors' order; a new key."""
        priority, times, span = state
        self.changes.note(np.array([old, new]))
        self.sampler.move(old, new, priority)
        if self._remover is not None:
            self._remover.move(old, new, priority)
        self.records.place_moved(new, priority, times, span)
        self.counts["relocations"] += 1

    # ------------------------------------------------------------ by key
    def update(self, slots: np.ndarray, prios: np.ndarray) -> None:
        """Set the priorities of held items (distinct slots)."""
        if len(slots):
            self.changes.note(slots)
            if self.keeps_priorities:
                self.priority[slots] = prios
            self.max_priority = max(self.max_priority, float(prios.max()))
            self.sampler.update(slots, prios)
            if self._remover is not None:
                self._remover.update(slots, prios)

    def held(self, keys: Any, priorities: Any, stale_counter: str):
        """``(slots, priorities)`` of the held items that ``keys`` name, each slot once (the
        last key for it wins); keys of items no longer held are skipped and counted in
        ``stale_counter``. ``priorities`` is ``None`` for deletes (see
        :mod:`rlreplay.core.held_keys`).

        Raises:
            InvalidArgumentError: for keys this table never issued or invalid priorities;
                nothing is counted or changed then.
        """
        deleting = stale_counter == "stale_deletes"
        slots, values, stale = held_keys.held(
            _kernel, self.records, self.origin, keys, priorities, deleting
        )
        self.check_priority_range(values)
        if stale:
            self.counts[stale_counter] += stale
        return slots, values

    def reset(self) -> None:
        """Remove every item (counters and generations stay, but ``sampled_items``)."""
        self.changes.note_all()
        self.counts["sampled_items"] = 0
        self.live.fill(False)
        self.sampler.clear()
        if self._remover is not None:
            self._remover.clear()
        self.size = 0
        self.max_priority = 1.0

    # ------------------------------------------------------------ checkpoints
    @property
    def newest(self) -> int:
        """The slot of the item inserted last (the order an idle remover's state uses)."""
        return self._newest

    def state(
        self, into: dict[str, Any] | None = None, *, idle_remover_later: bool = False
    ) -> dict[str, Any]:
        """A snapshot (copies, lock held) of every slot's item state, the size, the
        counters, the generation origin and both selectors' states, for checkpoints;
        :meth:`load_state` puts it back. ``into``: arrays from :meth:`state_buffers` to
        copy into instead of allocating. ``idle_remover_later``: leave an idle
        remover's state ``None``, for :func:`~rlreplay.core.idle_remover.idle_state` to
        make from the snapshot where one is needed, after the lock is released (it costs
        an index build, not a copy)."""
        into = into or {}
        out: dict[str, Any] = self.records.state(into)
        return self._with_scalars(out, into, None, idle_remover_later)

    def _with_scalars(
        self, out: dict[str, Any], into: dict[str, Any], sampler: Any, idle_remover_later: bool
    ) -> dict[str, Any]:
        """``out`` (the per-slot arrays) completed with the state beside them, taken now
        (lock held): sizes, counters, the sampler's state (``sampler`` if already copied
        in slices) and the remover's (None for an idle remover built later)."""
        extent = out.pop("extent", None)
        out.update(
            size=self.size,
            max_priority=self.max_priority,
            origin=self.origin,
            newest=self.newest,
            counts=dict(self.counts),
            sampler=sampler if sampler is not None else self.sampler.state(into.get("sampler")),
            remover=(
                None
                if idle_remover_later and not self.remover_active
                else self._remover_state(into.get("remover"))
            ),
        )
        if extent is not None:  # last, as the index has always listed it
            out["extent"] = extent
        return out

    def _remover_state(self, into: dict[str, Any] | None) -> dict[str, Any]:
        """The remover's state; an idle remover's is made now, holding the items in
        :func:`~rlreplay.core.idle_remover.idle_order`."""
        if self.remover_active:
            return self.remover.state(into)
        return idle_remover.idle_state(self.remover, self.live, self.newest, self.priority, into)

    def state_buffers(self) -> dict[str, Any]:
        """Arrays :meth:`state` can copy into, made (and written once) outside the
        table's lock; see :meth:`Selector.state_buffers`."""
        out = self.records.state_buffers()
        out["sampler"] = self.sampler.state_buffers()
        if self.remover_active:  # (an idle remover's state is made, not copied: no buffers)
            out["remover"] = self.remover.state_buffers()
        return out

    def start_sliced_state(self, into: dict[str, Any] | None) -> tuple[dict, list]:
        """The first step of a :meth:`state` taken in slices (lock held): the state's
        per-slot arrays, not filled yet (records, live flags, extents and, where the
        sampler offers them, its arrays: see :meth:`Selector.state_parts`), and the parts
        that fill them, ``(array, its copy, slots per entry)``. From now on the index
        notes the slots its mutations change. The caller copies the parts, a slice per
        lock hold; at the moment (lock held) it copies again the entries
        :meth:`take_changes` and :func:`~rlreplay.core.slot_changes.changed_entries`
        name and completes the state with :meth:`finish_scalars` (see
        :meth:`rlreplay.checkpoint.state_files.StateStream.moment`), or it calls
        :meth:`abandon_sliced_state`. (Arrays missing from ``into`` are made
        empty: they take no memory until written, so a caller that writes the slices
        elsewhere, into files, may use them only to see where each part's entries go.)"""
        into = into or {}
        out, parts = self.records.state_parts(into)
        sampler = self.sampler.state_parts(into.get("sampler"))
        if sampler is not None:
            out["sampler"], more = sampler
            parts = parts + more
        self.changes = SlotChanges(self.capacity)
        return out, parts

    def take_changes(self) -> np.ndarray | None:
        """The slots changed since :meth:`start_sliced_state`, sorted, each once, or
        ``None`` when every slot may have changed (a reset or a restore); the index stops
        noting changes (lock held)."""
        changes, self.changes = self.changes, UNTRACKED
        return None if not changes.tracking or changes.everything else changes.slots()

    def finish_scalars(
        self, out: dict[str, Any], into: dict[str, Any] | None, idle_remover_later: bool
    ) -> dict[str, Any]:
        """Complete a sliced state's ``out`` (its per-slot parts taken) with the rest of
        the state, taken now as :meth:`state` takes it (lock held)."""
        sampler = out.pop("sampler", None)
        return self._with_scalars(out, into or {}, sampler, idle_remover_later)

    def abandon_sliced_state(self) -> None:
        """Stop noting changes for a sliced state that will not finish (lock held)."""
        self.changes = UNTRACKED

    def moment_buffers(self) -> dict[str, Any]:
        """Arrays for what the moment of a sliced state copies whole (lock held), made
        outside the lock: the sampler's state where the sampler offers no parts, an
        active remover's state (an idle remover's is not taken)."""
        out: dict[str, Any] = {}
        if type(self.sampler).state_parts is Selector.state_parts:  # no parts offered
            out["sampler"] = self.sampler.state_buffers()
        if self.remover_active:
            out["remover"] = self.remover.state_buffers()
        return out

    def _check_state(self, state: dict[str, Any]) -> int:
        """Check that ``state`` fits this index (arrays of one entry per slot, live flags
        that agree with the size, an origin in range); returns its size.

        Raises:
            InvalidArgumentError: naming what does not fit, the sampler's and an active
                remover's states included.
        """
        self.records.check_state(state)
        self.sampler.check_state(state["sampler"])
        if self.remover_active:  # an idle remover keeps no state to load
            self.remover.check_state(state["remover"])
        size = int(state["size"])
        live = int(np.count_nonzero(state["live"]))
        if live != size or not 0 <= state["origin"] < GENERATIONS:
            raise InvalidArgumentError(
                f"item state holds {live} live slots but size={size}, or "
                f"origin={state['origin']} is out of range: it is not an index's state"
            )
        return size

    def load_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state` returned, for an index of the same capacity and
        extents (lock held).

        Raises:
            InvalidArgumentError: if an array does not fit this index (the selectors'
                states included), or the live flags disagree with the size; nothing
                changes then.
        """
        size = self._check_state(state)
        self.changes.note_all()
        self.records.load_state(state)
        self.size = size
        self.max_priority = float(state["max_priority"])
        self.origin = int(state["origin"])
        self._newest = int(state.get("newest", self.capacity - 1)) % self.capacity  # a hint
        self.counts.update({name: int(state["counts"].get(name, 0)) for name in COUNTERS})
        if "sampled_items" not in state["counts"]:  # a state saved before the counter: the
            # held items drawn so far (those already gone are not known)
            held = self.live
            self.counts["sampled_items"] = int(np.count_nonzero(self.times_sampled[held]))
        self.sampler.load_state(state["sampler"])
        if self._remover is not None:  # an idle remover keeps no state to load
            self._remover.load_state(state["remover"])

    def nbytes(self) -> int:
        """Bytes of item bookkeeping (per-slot state, sampler and remover indexes)."""
        remover = self.remover.nbytes() if self.remover_active else 0
        return self.records.nbytes() + self.sampler.nbytes() + remover
