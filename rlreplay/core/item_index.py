"""The item index: a table's items, one per anchor slot, and the state that goes with them.

The slot of an item is its anchor's row in the store. Every :class:`ItemIndex` method leaves
records, live flags, selectors, size and counters consistent, or raises before changing
anything. The table calls it with its lock held.
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
# Counted since creation but ``sampled_items``, which a reset zeroes (as Reverb does).


class ItemIndex:
    """A table's items by slot, with the sampler, the remover, the size and counters.

    Its attributes are read by the table and the draws but changed only through its methods,
    which keep the selectors and the change notes in step.

    Args:
        capacity: slots (the store's capacity: one per stored row).
        sampler, remover: the table's selectors (bound here to ``capacity`` slots).
        max_size: most items held; inserts beyond it evict the remover's choice.
        span: the layout's span (the steps an item reads).
        variable: whether items have per-item extents (``from_end``/``pad`` windows).
        default_priority: priority of items inserted without one (``None``: the largest seen).
        rng: the table's random generator (victims of random removers).
        origin: the table's generation origin (see keys.py), so other tables' keys are refused.
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
        self.records = records = SlotRecords(
            capacity, slot_record_dtype(sampler, remover), variable
        )
        self.keeps_priorities = records.keeps_priorities
        self.slot_state, self.slot_bytes = records.slot_state, records.slot_bytes
        self.priority, self.generation = records.priority, records.generation
        self.times_sampled = records.times_sampled
        self.live, self.extent = records.live, records.extent
        self.live_in, self.any_live_in = records.live_in, records.any_live_in
        sampler.bind(capacity)
        self.remover_active = not idle_remover.remover_is_idle(capacity, max_size)
        self._remover = remover if self.remover_active else None
        if self._remover is not None:
            remover.bind(capacity)
        self.priority_cap = min(
            sampler.max_priority, remover.max_priority if self.remover_active else float("inf")
        )
        self._newest = capacity - 1  # the slot of the item inserted last (idle order)
        self.size = 0
        self.max_priority = 1.0
        self.counts = dict.fromkeys(COUNTERS, 0)
        # While a checkpoint copies slices, the slots each mutation changes are noted here.
        self.changes: SlotChanges | Untracked = UNTRACKED

    def check_priority_range(self, prios: np.ndarray | None, argument: str = "priorities") -> None:
        """Refuse priorities beyond what the selectors take.

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
        """Make new items at distinct ``slots`` (``arange(start, start + n)`` when ``start`` is
        given); return keys. Items held there (rows the caller just rewrote) are evicted as
        overwrites, or replaced in the selectors when all of them are."""
        n = len(slots)
        fill = self.default_priority
        fill = self.max_priority if fill is None else float(fill)
        self.changes.note(slots)
        if prios is not None:
            self.max_priority = max(self.max_priority, float(prios.max()))
        # A full index has every slot live: nothing to count.
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

    def remove(self, slots: np.ndarray) -> None:
        """Remove the held items at ``slots`` (distinct).

        Raises:
            InvalidArgumentError: if a slot is out of range or holds no item; nothing changes then.
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
        """:meth:`remove` without its checks."""
        self.changes.note(slots)
        self.sampler.delete(slots)
        if self._remover is not None:
            self._remover.delete(slots)
        self.live[slots] = False
        self.size -= len(slots)

    def evict_slots(self, slots: np.ndarray) -> None:
        """Remove held items at ``slots`` whose rows are overwritten (not checked again)."""
        self._drop(slots)
        self.counts["overwrite_evictions"] += len(slots)

    def evict_rows(self, start: int, n: int) -> None:
        """Remove the items anchored on rows ``[start, start + n)`` (wrapping)."""
        if n <= 0 or self.size == 0:
            return
        doomed = self.live_in(start, n)
        if len(doomed):
            self.evict_slots(doomed)

    def spans(self, slots: np.ndarray) -> np.ndarray:
        """Steps each item at ``slots`` reads (its extent, or the layout's span)."""
        if self.extent is not None:
            return self.extent[slots].astype(np.int64)
        return np.full(len(slots), self.span, dtype=np.int64)

    def detach_for_move(self, slot: int) -> tuple[int, tuple[float, int, int]]:
        """Take the item at ``slot`` off its row, keeping its selector entries."""
        span = int(self.spans(np.array([slot]))[0])
        state = (float(self.priority[slot]), int(self.times_sampled[slot]), span)
        self.changes.note(np.array([slot]))
        self.live[slot] = False
        return span, state

    def attach_moved(self, old: int, new: int, state: tuple[float, int, int]) -> None:
        """The item taken off ``old`` now lives at ``new``, with a new key."""
        priority, times, span = state
        self.changes.note(np.array([old, new]))
        self.sampler.move(old, new, priority)
        if self._remover is not None:
            self._remover.move(old, new, priority)
        self.records.place_moved(new, priority, times, span)
        self.counts["relocations"] += 1

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
        """``(slots, priorities)`` of the held items ``keys`` name; stale keys are counted.

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

    @property
    def newest(self) -> int:
        """The slot of the item inserted last."""
        return self._newest

    def state(
        self, into: dict[str, Any] | None = None, *, idle_remover_later: bool = False
    ) -> dict[str, Any]:
        """A snapshot (copies, lock held) of the index for checkpoints; see :meth:`load_state`.

        ``into``: arrays from :meth:`state_buffers`. ``idle_remover_later``: leave an idle
        remover's state ``None``, for :func:`~rlreplay.core.idle_remover.idle_state`.
        """
        into = into or {}
        out: dict[str, Any] = self.records.state(into)
        return self._with_scalars(out, into, None, idle_remover_later)

    def _with_scalars(
        self, out: dict[str, Any], into: dict[str, Any], sampler: Any, idle_remover_later: bool
    ) -> dict[str, Any]:
        """``out`` completed with sizes, counters and selector states (lock held)."""
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
        """The remover's state; an idle remover's is made now."""
        if self.remover_active:
            return self.remover.state(into)
        return idle_remover.idle_state(self.remover, self.live, self.newest, self.priority, into)

    def state_buffers(self) -> dict[str, Any]:
        """Arrays :meth:`state` can copy into, made outside the table's lock."""
        out = self.records.state_buffers()
        out["sampler"] = self.sampler.state_buffers()
        if self.remover_active:  # (an idle remover's state is made, not copied: no buffers)
            out["remover"] = self.remover.state_buffers()
        return out

    def start_sliced_state(self, into: dict[str, Any] | None) -> tuple[dict, list]:
        """Start a :meth:`state` taken in slices (lock held); returns its arrays and parts.

        From now on the index notes the slots it changes, until :meth:`take_changes` or
        :meth:`abandon_sliced_state`.
        """
        into = into or {}
        out, parts = self.records.state_parts(into)
        sampler = self.sampler.state_parts(into.get("sampler"))
        if sampler is not None:
            out["sampler"], more = sampler
            parts = parts + more
        self.changes = SlotChanges(self.capacity)
        return out, parts

    def take_changes(self) -> np.ndarray | None:
        """Slots changed since :meth:`start_sliced_state` (``None``: all); stops noting."""

        changes, self.changes = self.changes, UNTRACKED
        return None if not changes.tracking or changes.everything else changes.slots()

    def finish_scalars(
        self, out: dict[str, Any], into: dict[str, Any] | None, idle_remover_later: bool
    ) -> dict[str, Any]:
        """Complete a sliced state's ``out`` with the rest of the state (lock held)."""
        sampler = out.pop("sampler", None)
        return self._with_scalars(out, into or {}, sampler, idle_remover_later)

    def abandon_sliced_state(self) -> None:
        """Stop noting changes for a sliced state that will not finish (lock held)."""
        self.changes = UNTRACKED

    def moment_buffers(self) -> dict[str, Any]:
        """Arrays for what a sliced state's moment copies whole, made outside the lock."""
        out: dict[str, Any] = {}
        if type(self.sampler).state_parts is Selector.state_parts:  # no parts offered
            out["sampler"] = self.sampler.state_buffers()
        if self.remover_active:
            out["remover"] = self.remover.state_buffers()
        return out

    def _check_state(self, state: dict[str, Any]) -> int:
        """Check that ``state`` fits this index; returns its size. Raises InvalidArgumentError."""
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
        """Put back what :meth:`state` returned (lock held).

        Raises:
            InvalidArgumentError: if an array does not fit this index or the live flags disagree
                with the size; nothing changes then.
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
        """Bytes of item bookkeeping."""
        remover = self.remover.nbytes() if self.remover_active else 0
        return self.records.nbytes() + self.sampler.nbytes() + remover
