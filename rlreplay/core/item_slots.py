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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core import idle_remover
from rlreplay.core._compiled import load_kernel
from rlreplay.core.keys import (
    CYCLED,
    GENERATION_MASK,
    GENERATIONS,
    SLOT_BITS,
    check_priorities,
    current_generations,
    has_duplicates,
    make_keys,
    next_generation,
    next_generations,
    relative_generations,
    split_keys,
    unissued,
)
from rlreplay.core.selectors import Selector
from rlreplay.core.selectors.base import copy_into, touched
from rlreplay.errors import InvalidArgumentError, describe

_kernel = load_kernel("rlreplay.core._slots")

# Per-slot item state (the compiled loops in _draws.c and _slots.c rely on these layouts:
# the first 8 bytes alike, the priority at byte 8 where there is one).
SLOT_STATE = np.dtype([("generation", "<u4"), ("times_sampled", "<u4"), ("priority", "<f8")])
SLOT_STATE_UNPRIORITIZED = np.dtype([("generation", "<u4"), ("times_sampled", "<u4")])
UNKEPT_PRIORITY = 1.0
"""What the priority of every item reads as in a table that keeps no priorities."""


def keeps_priorities(sampler: Any, remover: Any) -> bool:
    """Whether a table with these selectors keeps its items' priorities: unless both
    ignore them (``uses_priorities``: Uniform, Fifo and Lifo do), so a uniform table
    spends no 8 bytes per slot on numbers nothing reads."""
    return getattr(sampler, "uses_priorities", True) or getattr(remover, "uses_priorities", True)


def slot_record_dtype(sampler: Any, remover: Any) -> np.dtype:
    """The per-slot record of a table with these selectors (16 or 8 bytes)."""
    return SLOT_STATE if keeps_priorities(sampler, remover) else SLOT_STATE_UNPRIORITIZED

COUNTERS = (
    "deletes",
    "evictions",
    "overwrite_evictions",
    "relocations",
    "stale_updates",
    "stale_deletes",
)


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
        max_priority, origin, keeps_priorities, remover_active.

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
        # One record per slot, so a sampled item's state is one cache line, not three;
        # ``priority``, ``generation`` and ``times_sampled`` are views of its fields and
        # ``slot_bytes`` its bytes (slots x record bytes), as the compiled loops take them.
        record = slot_record_dtype(sampler, remover)
        self.keeps_priorities = "priority" in record.names
        self.slot_state = np.zeros(capacity, dtype=record)
        if self.keeps_priorities:
            self.priority = self.slot_state["priority"]
        else:
            self.priority = np.broadcast_to(np.float64(UNKEPT_PRIORITY), (capacity,))
        self.generation = self.slot_state["generation"]
        self.times_sampled = self.slot_state["times_sampled"]
        self.slot_bytes = self.slot_state.view(np.uint8).reshape(capacity, record.itemsize)
        self.live = np.zeros(capacity, dtype=bool)
        # Memoryviews of the same arrays: one-slot reads and writes through them cost a
        # third of numpy's scalar indexing (the one-row insert does several).
        self._slot_views = (
            memoryview(self.generation),
            memoryview(self.priority) if self.keeps_priorities else None,
            memoryview(self.times_sampled),
        )
        self._live_view = memoryview(self.live)
        self.extent = np.zeros(capacity, dtype=np.int32) if variable else None
        sampler.bind(capacity)
        self.remover_active = not idle_remover.remover_is_idle(capacity, max_size)
        # The remover's calls go to ``_remover``: None while it is idle.
        self._remover = remover if self.remover_active else None
        if self._remover is not None:
            remover.bind(capacity)
        self._newest = capacity - 1  # the slot of the item inserted last (idle order)
        self.size = 0
        self.max_priority = 1.0
        self.counts = dict.fromkeys(COUNTERS, 0)

    # --------------------------------------------------------------- creation
    def _fill(self) -> float:
        fill = self.default_priority
        return self.max_priority if fill is None else float(fill)

    def _make_room_for(self, n: int) -> None:
        """Evict the remover's choice so that ``n`` more items fit ``max_size``."""
        excess = self.size + n - self.max_size
        if excess > 0:
            victims = self.remover.choose_victims(excess, self.rng)
            self.remove(victims)
            self.counts["evictions"] += len(victims)

    def _evict_one(self) -> int:
        """The remover's choice of one item to evict for a one-row insert, marked not
        live and counted; the caller takes it out of the selectors with
        ``evict_insert_one`` as the new item comes in (for ``Prioritized``, one compiled
        call for both leaves in both trees)."""
        victim = int(self.remover.choose_victims(1, self.rng)[0])
        self._live_view[victim] = False
        self.counts["evictions"] += 1
        return victim

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
        fill = self._fill()
        if prios is not None:
            self.max_priority = max(self.max_priority, float(prios.max()))
        at = slots if start is None else slice(start, start + n)
        held = int(np.count_nonzero(self.live[at]))
        replacing = held == n
        if replacing:
            self.counts["overwrite_evictions"] += n
        else:
            if held:
                self.evict_slots(slots[self.live[at]])
            self._make_room_for(n)
        if start is not None and _kernel is not None:
            keys = np.empty(n, dtype=np.int64)
            if prios is not None:
                prios = np.ascontiguousarray(prios, dtype=np.float64)
            _kernel.claim_range(start, keys, self.slot_bytes, self.live, prios, fill, self.origin)
            prios = self.priority[start : start + n]
        else:
            if prios is None:
                prios = np.full(n, fill, dtype=np.float64)
            generations = next_generations(self.generation[at])
            self.generation[at] = generations
            if self.keeps_priorities:
                self.priority[at] = prios
            self.times_sampled[at] = 0
            self.live[at] = True
            keys = make_keys(slots, generations, self.origin)
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

    def claim_one(self, slot: int, prio: float | None) -> int:
        """:meth:`claim` for one slot, in Python scalars; returns the key."""
        if prio is None:
            fill = self.default_priority
            prio = self.max_priority if fill is None else float(fill)
        elif prio > self.max_priority:
            self.max_priority = prio
        replacing = self._live_view[slot]
        victim = -1
        if replacing:
            self.counts["overwrite_evictions"] += 1
        elif self.size >= self.max_size:
            victim = self._evict_one()
        else:
            self.size += 1
        generations, priorities, times = self._slot_views
        generation = generations[slot] + 1
        if not generation & GENERATION_MASK:  # past the last generation: 1 again (keys.py)
            generation = CYCLED | 1
        generations[slot] = generation
        if priorities is not None:
            priorities[slot] = prio
        times[slot] = 0
        self._live_view[slot] = True
        self._newest = slot
        remover = self._remover
        if replacing:
            self.sampler.replace_one(slot, prio)
            if remover is not None:
                remover.replace_one(slot, prio)
        elif victim >= 0:  # the victim leaves each selector as the new item comes in
            self.sampler.evict_insert_one(victim, slot, prio)
            remover.evict_insert_one(victim, slot, prio)  # active: it chose the victim
        else:
            self.sampler.insert_one(slot, prio)
            if remover is not None:
                remover.insert_one(slot, prio)
        generation = (generation & GENERATION_MASK) + self.origin  # the key's (keys.py)
        if generation > GENERATIONS:
            generation -= GENERATIONS
        return generation << SLOT_BITS | slot

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
        self.sampler.delete(slots)
        if self._remover is not None:
            self._remover.delete(slots)
        self.live[slots] = False
        self.size -= len(slots)

    def evict_slots(self, slots: np.ndarray) -> None:
        """Remove held items whose rows are overwritten (counted as overwrite evictions)."""
        if len(slots) == 1:
            slot = int(slots[0])
            self.sampler.delete_one(slot)
            if self._remover is not None:
                self._remover.delete_one(slot)
            self._live_view[slot] = False
            self.size -= 1
        else:
            self.remove(slots)
        self.counts["overwrite_evictions"] += len(slots)

    def live_in(self, start: int, n: int) -> np.ndarray:
        """Slots holding items among rows ``[start, start + n)`` (wrapping), in row order."""
        cap = self.capacity
        n = min(n, cap)
        end = start + n
        if end <= cap:
            return np.flatnonzero(self.live[start:end]) + start
        return np.concatenate(
            [np.flatnonzero(self.live[start:]) + start, np.flatnonzero(self.live[: end - cap])]
        )

    def any_live_in(self, start: int, n: int) -> bool:
        """Whether an item is anchored on rows ``[start, start + n)`` (wrapping)."""
        cap = self.capacity
        n = min(n, cap)
        end = start + n
        if end <= cap:
            return bool(self.live[start:end].any())
        return bool(self.live[start:].any() or self.live[: end - cap].any())

    def evict_rows(self, start: int, n: int) -> None:
        """Remove the items anchored on rows ``[start, start + n)`` (wrapping), which the
        store is about to overwrite."""
        if n <= 0 or self.size == 0:
            return
        if n == 1:
            if self._live_view[start]:
                self.sampler.delete_one(start)
                if self._remover is not None:
                    self._remover.delete_one(start)
                self._live_view[start] = False
                self.size -= 1
                self.counts["overwrite_evictions"] += 1
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
        self.live[slot] = False
        return span, state

    def attach_moved(self, old: int, new: int, state: tuple[float, int, int]) -> None:
        """The item taken off ``old`` now lives at ``new``, where its steps were copied:
        same priority, times sampled and place in the selectors' order; a new key."""
        priority, times, span = state
        self.sampler.move(old, new, priority)
        if self._remover is not None:
            self._remover.move(old, new, priority)
        self.generation[new] = next_generation(int(self.generation[new]))
        if self.keeps_priorities:
            self.priority[new] = priority
        self.times_sampled[new] = times
        if self.extent is not None:
            self.extent[new] = span
        self.live[new] = True
        self.counts["relocations"] += 1

    # ------------------------------------------------------------ by key
    def update(self, slots: np.ndarray, prios: np.ndarray) -> None:
        """Set the priorities of held items (distinct slots)."""
        if len(slots):
            if self.keeps_priorities:
                self.priority[slots] = prios
            self.max_priority = max(self.max_priority, float(prios.max()))
            self.sampler.update(slots, prios)
            if self._remover is not None:
                self._remover.update(slots, prios)

    def held(self, keys: Any, priorities: Any, stale_counter: str):
        """``(slots, priorities)`` of the held items that ``keys`` name, each slot once (the
        last key for it wins); keys of items no longer held are skipped and counted in
        ``stale_counter``. ``priorities`` is ``None`` for deletes.

        Raises:
            InvalidArgumentError: for keys this table never issued or invalid priorities;
                nothing is counted or changed then.
        """
        deleting = stale_counter == "stale_deletes"
        if (
            _kernel is not None
            and type(keys) is np.ndarray
            and keys.dtype == np.int64
            and keys.ndim == 1
            and keys.flags.c_contiguous
        ):
            n = len(keys)
            values = None
            if not deleting and type(priorities) is np.ndarray:
                values = np.ascontiguousarray(priorities, dtype=np.float64)
            if deleting or (values is not None and values.shape == (n,)):
                out_slots = np.empty(n, dtype=np.int64)
                out_values = None if deleting else np.empty(n)
                held = _kernel.held_slots(
                    keys, self.slot_bytes, self.live, values, out_slots, out_values, self.origin
                )
                if held is not None:  # else a bad entry: the path below names it
                    kept, stale = held
                    if stale:
                        self.counts[stale_counter] += stale
                    return out_slots[:kept], None if deleting else out_values[:kept]
        keys, slots, gens = split_keys(keys, self.capacity)
        prios = None if deleting else check_priorities(priorities, len(keys))
        return self._current(keys, slots, gens, prios, stale_counter)

    def _current(self, keys, slots, gens, values, stale_counter):
        """Keep the last occurrence of each held key; count the stale ones.

        Raises:
            InvalidArgumentError: for a key this table never issued (generation 0, or
                outside the generations it issued for the slot while the slot has not
                cycled: a key of another table, see keys.py); nothing is counted or
                changed then.
        """
        fields = self.generation[slots]
        gens = relative_generations(gens, self.origin)
        never = unissued(gens, fields)
        if never.any():
            raise InvalidArgumentError(
                f"keys contains {describe(keys[never][:4].tolist())}, which are not keys of "
                "this table (it never issued them: keys of another table, or made up); pass "
                "keys taken from this table's samples or inserts"
            )
        held = self.live[slots] & (current_generations(fields) == gens)
        n_held = int(np.count_nonzero(held))
        if n_held != len(slots):
            self.counts[stale_counter] += len(slots) - n_held
            slots = slots[held]
            values = None if values is None else values[held]
        if len(slots) > 1 and has_duplicates(slots):
            order = np.argsort(slots, kind="stable")
            ordered = slots[order]
            last = np.empty(len(slots), dtype=bool)
            last[-1] = True
            np.not_equal(ordered[1:], ordered[:-1], out=last[:-1])
            keep = order[last]  # the last occurrence of each slot, in slot order
            slots = slots[keep]
            values = None if values is None else values[keep]
        return slots, values

    def reset(self) -> None:
        """Remove every item (counters and generations stay)."""
        self.live.fill(False)
        self.sampler.clear()
        if self._remover is not None:
            self._remover.clear()
        self.size = 0
        self.max_priority = 1.0

    # ------------------------------------------------------------ checkpoints
    def state(
        self, into: dict[str, Any] | None = None, *, idle_remover_later: bool = False
    ) -> dict[str, Any]:
        """A snapshot (copies, lock held) of every slot's item state, the size, the
        counters, the generation origin and both selectors' states, for checkpoints;
        :meth:`load_state` puts it back. ``into``: arrays from :meth:`state_buffers` to
        copy into instead of allocating. ``idle_remover_later``: leave an idle
        remover's state ``None``, for :meth:`idle_remover_state` to make from the
        snapshot after the lock is released (it costs an index build, not a copy)."""
        into = into or {}
        # One copy of the records' bytes (a structured copy, or one per field, costs
        # several times more); the fields are views of it.
        records = copy_into(self.slot_bytes, into, "records").reshape(-1)
        records = records.view(self.slot_state.dtype)
        if self.keeps_priorities:
            priority = records["priority"]
        else:  # the constant every priority reads as (a buffer filled outside the lock)
            priority = into.get("priority")
            if priority is None:
                priority = np.full(self.capacity, UNKEPT_PRIORITY)
        out: dict[str, Any] = {
            "priority": priority,
            "generation": records["generation"],
            "times_sampled": records["times_sampled"],
            "live": copy_into(self.live, into, "live"),
            "size": self.size,
            "max_priority": self.max_priority,
            "origin": self.origin,
            "newest": self._newest,
            "counts": dict(self.counts),
            "sampler": self.sampler.state(into.get("sampler")),
            "remover": (
                None
                if idle_remover_later and not self.remover_active
                else self._remover_state(into.get("remover"))
            ),
        }
        if self.extent is not None:
            out["extent"] = copy_into(self.extent, into, "extent")
        return out

    def state_buffers(self) -> dict[str, Any]:
        """Arrays :meth:`state` can copy into, made (and written once) outside the
        table's lock; see :meth:`Selector.state_buffers`."""
        out: dict[str, Any] = {
            "records": touched(self.slot_bytes.shape, np.uint8),
            "live": touched(self.live.shape, bool),
            "sampler": self.sampler.state_buffers(),
            "remover": (
                self.remover.state_buffers()
                if self.remover_active
                else idle_remover.bound_copy(self.remover, self.capacity).state_buffers()
            ),
        }
        if not self.keeps_priorities:
            out["priority"] = np.full(self.capacity, UNKEPT_PRIORITY)
        if self.extent is not None:
            out["extent"] = touched(self.extent.shape, self.extent.dtype)
        return out

    def load_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state` returned, for an index of the same capacity and
        extents (lock held).

        Raises:
            InvalidArgumentError: if an array does not fit this index, or the live flags
                disagree with the size; nothing changes then (the selectors check their
                own states).
        """
        cap = self.capacity
        names = ["priority", "generation", "times_sampled", "live"]
        names += ["extent"] if self.extent is not None else []
        for name in names:
            arr = state.get(name)
            if not isinstance(arr, np.ndarray) or arr.shape != (cap,):
                raise InvalidArgumentError(
                    f"item state {name!r} is {describe(arr)}; this index needs an array of "
                    f"{cap} entries (one per slot)"
                )
        size = int(state["size"])
        if int(np.count_nonzero(state["live"])) != size or not 0 <= state["origin"] < GENERATIONS:
            raise InvalidArgumentError(
                f"item state holds {int(np.count_nonzero(state['live']))} live slots but "
                f"size={size}, or origin={state['origin']} is out of range: it is not an "
                "index's state"
            )
        if self.keeps_priorities:
            self.priority[:] = state["priority"]
        self.generation[:] = state["generation"]
        self.times_sampled[:] = state["times_sampled"]
        self.live[:] = state["live"]
        if self.extent is not None:
            self.extent[:] = state["extent"]
        self.size = size
        self.max_priority = float(state["max_priority"])
        self.origin = int(state["origin"])
        self._newest = int(state.get("newest", cap - 1)) % cap  # an order hint only
        self.counts.update({name: int(state["counts"].get(name, 0)) for name in COUNTERS})
        self.sampler.load_state(state["sampler"])
        if self._remover is not None:  # an idle remover keeps no state to load
            self._remover.load_state(state["remover"])

    def nbytes(self) -> int:
        """Bytes of item bookkeeping (per-slot state, sampler and remover indexes)."""
        own = self.slot_state.nbytes + self.live.nbytes
        remover = self.remover.nbytes() if self.remover_active else 0
        return own + self.sampler.nbytes() + remover

    def idle_remover_state(
        self, state: dict[str, Any], into: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The idle remover's state for a snapshot :meth:`state` took with
        ``idle_remover_later=True``, made from the snapshot's own arrays (no lock
        needed: it reads nothing of the live index)."""
        return idle_remover.idle_state(
            self.remover, state["live"], state["newest"], state["priority"], into
        )

    def _remover_state(self, into: dict[str, Any] | None) -> dict[str, Any]:
        """The remover's state; an idle remover's is made now, holding the items in
        :func:`~rlreplay.core.idle_remover.idle_order`."""
        if self.remover_active:
            return self.remover.state(into)
        return idle_remover.idle_state(
            self.remover, self.live, self._newest, self.priority, into
        )
