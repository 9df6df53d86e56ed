"""Item slots: the per-slot state of a table's items and how it changes.

A table holds at most one item per anchor step, in the slot equal to the anchor's row in
the step store. This module keeps that state consistent with the sampler and the remover:
creating items, removing them, and handing over the slots of items whose steps the store
overwrites. :class:`ItemSlots` is a part of :class:`rlreplay.core.table.Table` and relies on the
attributes ``Table.__init__`` sets; every method here expects the table's lock to be held.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core._compiled import load_kernel
from rlreplay.core.keys import (
    CYCLED,
    GENERATION_MASK,
    SLOT_BITS,
    check_priorities,
    current_generations,
    has_duplicates,
    make_keys,
    next_generation,
    next_generations,
    split_keys,
    unissued,
)
from rlreplay.errors import InvalidArgumentError, describe

_kernel = load_kernel("rlreplay.core._slots")


class ItemSlots:
    """Creation, removal and overwrite hand-over of a table's items (lock held)."""

    def _append_rows_locked(
        self, rows: dict, n: int, timeout: float | None, one_row: bool = False
    ) -> int:
        """Append rows to the store for :meth:`insert` (``one_row``: ``rows`` has no batch
        axis), letting :meth:`_on_overwrite` defer the removal of the items whose slots
        the new rows take."""
        self._inserting = True
        try:
            if one_row:
                return self.store._append_one_locked(rows, timeout, "rows")
            return self.store._append_steps_locked(rows, n, timeout, "rows")
        except BaseException:
            self._settle_deferred()
            raise
        finally:
            self._inserting = False

    def _settle_deferred(self) -> None:
        """Remove the deferred items from the selectors (their slots are not reused)."""
        deferred = self._deferred
        if deferred is not None:
            self._deferred = None
            start, n = deferred
            if n == 1:
                self.sampler.delete_one(start)
                self.remover.delete_one(start)
            else:
                slots = np.arange(start, start + n)
                self.sampler.delete(slots)
                self.remover.delete(slots)

    def _insert_items_locked(
        self, slots: np.ndarray, prios: np.ndarray | None, start: int | None = None
    ) -> np.ndarray:
        """Make items at ``slots`` (``slots == arange(start, start + n)`` when ``start``
        is given, which lets per-slot state be written through slices)."""
        n = len(slots)
        fill = self.default_priority
        if fill is None:
            fill = self._max_priority
        if prios is not None:
            self._max_priority = max(self._max_priority, float(prios.max()))
        excess = self.size + n - self.max_size
        replacing = excess <= 0 and self._deferred is not None and self._deferred == (start, n)
        if not replacing:
            self._settle_deferred()
        if excess > 0:
            victims = self.remover.choose_victims(excess, self.rng)
            self._remove_locked(victims)
            self._counts["evictions"] += len(victims)
        if start is not None and _kernel is not None:
            keys = np.empty(n, dtype=np.int64)
            if prios is not None:
                prios = np.ascontiguousarray(prios, dtype=np.float64)
            _kernel.claim_range(start, keys, self._slot_bytes, self._live, prios, fill)
            prios = self._priority[start : start + n]
        else:
            if prios is None:
                prios = np.full(n, fill, dtype=np.float64)
            at = slots if start is None else slice(start, start + n)
            generations = next_generations(self._generation[at])
            self._generation[at] = generations
            self._priority[at] = prios
            self._times_sampled[at] = 0
            self._live[at] = True
            keys = make_keys(slots, generations)
        if replacing:
            self._deferred = None
            self.sampler.replace(slots, prios)
            self.remover.replace(slots, prios)
        else:
            self.sampler.insert(slots, prios)
            self.remover.insert(slots, prios)
        self.size += n
        self.rate_limiter.inserts += n
        self._wake_waiters()
        return keys

    def _insert_one_locked(self, slot: int, prio: float | None, in_place: bool = False) -> int:
        """:meth:`_insert_items_locked` for one slot, in Python scalars; returns the key.

        ``in_place``: ``slot`` holds this table's own item, whose row the one-row insert
        has just overwritten; the new item takes its selector entries (an overwrite
        eviction, as :meth:`_on_overwrite` would count it).
        """
        if prio is None:
            fill = self.default_priority
            prio = self._max_priority if fill is None else float(fill)
        elif prio > self._max_priority:
            self._max_priority = prio
        if in_place:
            replacing = True
            self._counts["overwrite_evictions"] += 1
        else:
            replacing = self.size < self.max_size and self._deferred == (slot, 1)
            if not replacing:
                self._settle_deferred()
            if self.size >= self.max_size:
                victims = self.remover.choose_victims(1, self.rng)
                self._remove_locked(victims)
                self._counts["evictions"] += len(victims)
            self._deferred = None
            self.size += 1
        generations, priorities, times = self._slot_views
        generation = generations[slot] + 1
        if not generation & GENERATION_MASK:  # past the last generation: 1 again (keys.py)
            generation = CYCLED | 1
        generations[slot] = generation
        priorities[slot] = prio
        times[slot] = 0
        self._live_view[slot] = True
        if replacing:
            self.sampler.replace_one(slot, prio)
            self.remover.replace_one(slot, prio)
        else:
            self.sampler.insert_one(slot, prio)
            self.remover.insert_one(slot, prio)
        self.rate_limiter.inserts += 1
        self._wake_waiters()
        return (generation & GENERATION_MASK) << SLOT_BITS | slot

    def _remove_locked(self, slots: np.ndarray) -> None:
        self._live[slots] = False
        self.sampler.delete(slots)
        self.remover.delete(slots)
        self.size -= len(slots)

    def _on_overwrite(self, start: int, n: int) -> None:
        """Store hook: rows ``[start, start + n)`` (wrapping) are about to be overwritten."""
        cap = self.store.capacity
        if self._inserting and self._deferred is None and start + n <= cap:
            # insert() is writing these rows: if every one holds an item, the new items
            # take over their slots, so the selectors may keep the entries for them.
            if n == 1:
                if self._live_view[start]:
                    self._hand_over_one(start)
                    return
            else:
                live = self._live[start : start + n]
                if live.all():
                    live[:] = False
                    self.size -= n
                    self._counts["overwrite_evictions"] += n
                    self._deferred = (start, n)
                    return
        if n == 1:
            if not self._live[start]:
                return
            self._live[start] = False
            self.sampler.delete_one(start)
            self.remover.delete_one(start)
            self.size -= 1
            self._counts["overwrite_evictions"] += 1
            self._wake_waiters()
            return
        end = start + n
        if end <= cap:
            doomed = np.flatnonzero(self._live[start:end]) + start
        else:
            doomed = np.concatenate(
                [
                    np.flatnonzero(self._live[start:]) + start,
                    np.flatnonzero(self._live[: end - cap]),
                ]
            )
        if len(doomed) == 0:
            return
        self._remove_locked(doomed)
        self._counts["overwrite_evictions"] += len(doomed)
        self._wake_waiters()

    def _hand_over_one(self, slot: int) -> None:
        """The item on ``slot``, whose row this table's own one-row insert overwrites, is
        removed but keeps its selector entries for the new item (see :meth:`_on_overwrite`
        and :meth:`_insert_one_locked`)."""
        self._live_view[slot] = False
        self.size -= 1
        self._counts["overwrite_evictions"] += 1
        self._deferred = (slot, 1)

    def _wake_waiters(self) -> None:
        """Wake the calls waiting on the store's condition after a change; skipped when none
        waits, since notify_all() costs microseconds even then (the lock is held)."""
        if self.lock._waiters:
            self.lock.notify_all()

    def _relocate_pinned(self, start: int, n: int, timeout: float | None) -> bool:
        """For ``on_overwrite="relocate"``: if an item is anchored on rows ``[start, start
        + n)``, copy its steps to the head of the store and move it there (same priority,
        times sampled and place in the selectors' order; a new key). Returns whether one
        item moved. A stack's oldest items would otherwise pin their rows forever."""
        if self.on_overwrite != "relocate" or self.size == 0:
            return False
        store = self.store
        cap = store.capacity
        rows = np.arange(start, start + n) % cap
        live = np.flatnonzero(self._live[rows])
        if len(live) == 0:
            return False
        old = int(rows[live[0]])
        span = int(self._extent[old]) if self._extent is not None else self.layout.span
        steps = {p: col[(old + np.arange(span)) % cap] for p, col in store.columns.items()}
        priority, times = float(self._priority[old]), self._times_sampled[old]
        self._live[old] = False  # its rows may now be written; the selectors keep it
        try:
            new = store._append_locked(steps, span, timeout) % cap
        except BaseException:
            self._live[old] = True
            raise
        self.sampler.move(old, new, priority)
        self.remover.move(old, new, priority)
        self._generation[new] = next_generation(int(self._generation[new]))
        self._priority[new] = priority
        self._times_sampled[new] = times
        if self._extent is not None:
            self._extent[new] = span
        self._live[new] = True
        self._counts["relocations"] += 1
        return True

    def _blocks_overwrite(self, start: int, n: int) -> bool:
        if self.on_overwrite != "block" or self.size == 0:
            return False
        cap = self.store.capacity
        end = start + n
        if end <= cap:
            return bool(self._live[start:end].any())
        return bool(self._live[start:].any() or self._live[: end - cap].any())

    def _held(self, keys: Any, priorities: Any, stale_counter: str):
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
                    keys, self._slot_bytes, self._live, values, out_slots, out_values
                )
                if held is not None:  # else a bad entry: the path below names it
                    kept, stale = held
                    if stale:
                        self._counts[stale_counter] += stale
                    return out_slots[:kept], None if deleting else out_values[:kept]
        keys, slots, gens = split_keys(keys, self.store.capacity)
        prios = None if deleting else check_priorities(priorities, len(keys))
        return self._current(slots, gens, prios, stale_counter)

    def _current(self, slots, gens, values, stale_counter):
        """Keep the last occurrence of each held key; count the stale ones.

        Raises:
            InvalidArgumentError: for a key this table never issued (generation 0, or newer
                than its slot's while the slot has not cycled, see keys.py); nothing is
                counted or changed then.
        """
        fields = self._generation[slots]
        never = unissued(gens, fields)
        if never.any():
            bad = make_keys(slots[never], gens[never])
            raise InvalidArgumentError(
                f"keys contains {describe(bad[:4].tolist())}, which this table never issued; "
                "pass keys taken from this table's samples or inserts"
            )
        held = self._live[slots] & (current_generations(fields) == gens)
        n_held = int(np.count_nonzero(held))
        if n_held != len(slots):
            self._counts[stale_counter] += len(slots) - n_held
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

    def index_nbytes(self) -> int:
        """Bytes of item bookkeeping (per-slot state, sampler and remover indexes)."""
        own = self._slot_state.nbytes + self._live.nbytes
        return own + self.sampler.nbytes() + self.remover.nbytes()
