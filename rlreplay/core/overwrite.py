"""The overwrite protocol: how the step store hands over rows that items or writers hold.

Tables' items are anchored on rows, and each table's ``on_overwrite`` says what becomes of
items on rows about to be overwritten (``"evict"``, ``"block"``, ``"relocate"``). Writers
hold a :class:`Retention`: retained steps later items may anchor on. Invariant, whenever
the store's lock is free:

1. No item is served a step it did not anchor: before a row is written, its items are
   removed or moved, or the append waits.
2. Every table's size, live flags and selectors agree; nothing is left pending across a wait.
3. A writer's retained steps are contiguous and never overwritten: they are copied to the
   head instead; if they cannot fit, the append fails before anything changes.
4. Nothing deadlocks: an append plans every row it touches before changing anything, and
   waits (changing nothing) while a queue's items hold one.

Tables and retentions are held weakly: a dropped one stops holding rows.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rlreplay.errors import InvalidArgumentError

if TYPE_CHECKING:
    from rlreplay.core.item_index import ItemIndex


class RingStore(Protocol):
    """What the protocol needs of its :class:`~rlreplay.core.storage.StepStore`."""

    capacity: int
    lanes: int
    next_id: int

    def read_rows(self, rows: np.ndarray) -> dict[str, np.ndarray]: ...

    def read_range(self, first: int, n: int) -> dict[str, np.ndarray]: ...

    def write(self, steps: Mapping[str, Any], n: int) -> int | None: ...

    def wake_waiters(self) -> None: ...


class RowHolder(Protocol):
    """What the protocol needs of a :class:`~rlreplay.core.table.Table` whose items hold rows."""

    name: str
    on_overwrite: str
    index: ItemIndex

    def reset_locked(self) -> None: ...


class Retention:
    """A writer's retained steps: ids ``first .. first + count - 1``, at most ``limit``.

    Only the :class:`OverwriteProtocol` moves ``first``; the writer changes the range under the
    store's lock.
    """

    __slots__ = ("__weakref__", "count", "first", "limit")

    def __init__(self, limit: int):
        self.first = 0
        self.count = 0
        self.limit = limit

    @property
    def end(self) -> int:
        """One past the newest retained id."""
        return self.first + self.count

    def extend(self, first: int, n: int) -> None:
        """Retain ``n`` new steps from id ``first``, keeping the newest ``limit``."""
        count = self.count
        if count and first == self.first + count:
            count += n
        else:
            self.first, count = first, n
        if count > self.limit:
            self.first += count - self.limit
            count = self.limit
        self.count = count

    def release(self) -> None:
        """Let every retained step go."""
        self.count = 0


class OverwriteProtocol:
    """The hand-over of overwritten rows for one store; callers hold ``store.mutex``."""

    def __init__(self, store: RingStore):
        self._store = weakref.ref(store)
        self._tables: tuple[weakref.ref, ...] = ()
        self._retentions: tuple[weakref.ref, ...] = ()
        # The one table whose one-row insert may replace its own item in place.
        self.sole: weakref.ref | None = None
        self.blocker: str | None = None  # the queue that held the rows, after a refusal
        self.relocated_steps = 0  # steps copied to the head for writers and stacks
        self._stale = False  # a party was dropped since the last refresh()
        # Every table evicts and at most one writer retains: appends only evict, without a plan.
        self._evict_only = True
        self._only_retention: weakref.ref | None = None

    def attach(self, table: RowHolder) -> weakref.ref:
        """Register a table; returns the store's weak reference to it."""
        ref = weakref.ref(table, self._dropped)
        self._tables = (*self.live_refs(self._tables), ref)
        self.refresh()
        return ref

    def detach(self, table: RowHolder) -> None:
        """Forget a table: its items no longer hold rows."""
        self._tables = tuple(r for r in self.live_refs(self._tables) if r() is not table)
        self.refresh()

    def retain(self, limit: int) -> Retention:
        """A new :class:`Retention` for a writer keeping up to ``limit`` steps."""
        retention = Retention(limit)
        self._retentions = (
            *self.live_refs(self._retentions),
            weakref.ref(retention, self._dropped),
        )
        self.refresh()
        return retention

    def forget(self, retention: Retention) -> None:
        """Release a writer's retention for good."""
        retention.release()
        self._retentions = tuple(
            r for r in self.live_refs(self._retentions) if r() is not retention
        )
        self.refresh()

    def _dropped(self, _ref: weakref.ref) -> None:
        """A party was garbage-collected: flag a refresh (any thread, no lock)."""
        self._stale = True

    @staticmethod
    def live_refs(refs: tuple[weakref.ref, ...]) -> tuple[weakref.ref, ...]:
        return tuple(r for r in refs if r() is not None)

    def tables(self) -> list[RowHolder]:
        """The attached tables still alive."""
        return [t for t in (r() for r in self._tables) if t is not None]

    def retentions(self) -> list[Retention]:
        return [r for r in (ref() for ref in self._retentions) if r is not None]

    def refresh(self) -> None:
        """Recompute which table, if any, may use the one-row in-place path."""
        store = self._store()
        self._stale = False
        self._tables = self.live_refs(self._tables)
        self._retentions = self.live_refs(self._retentions)
        tables = self.tables()
        self._evict_only = all(t.on_overwrite == "evict" for t in tables)
        self._only_retention = self._retentions[0] if len(self._retentions) == 1 else None
        self.sole = None
        if store is not None and (
            len(tables) == 1
            and not self.retentions()
            and tables[0].on_overwrite == "evict"
            and store.lanes == 1
        ):
            self.sole = next(r for r in self._tables if r() is tables[0])

    def _overwritten(self, store: RingStore, w: int) -> tuple[int, int]:
        """Ids ``[lo, hi)`` that writing ``w`` steps at the head overwrites."""
        lo = store.next_id - store.capacity
        return max(lo, 0), max(lo + w, 0)

    def _plan(
        self, store: RingStore, n: int, own: Retention | None, keep: int
    ) -> tuple[int, list[Retention], list[tuple[RowHolder, np.ndarray]], bool]:
        """Plan ``(w, retentions, stack_items, move_own)`` for appending ``n``; changes nothing."""
        cap = store.capacity
        stacks = [t for t in self.tables() if t.on_overwrite == "relocate" and t.index.size]
        others = [r for r in self.retentions() if r is not own and r.count]
        keep = keep if own is not None else 0
        own_away = bool(keep and own.end != store.next_id)
        w = n + (keep if own_away else 0)
        moving: list[Retention] = []
        items: list[tuple[RowHolder, np.ndarray]] = []
        while True:
            if w > cap:
                raise InvalidArgumentError(
                    f"the store's capacity={cap} steps cannot hold the steps writers retain "
                    f"({sum(r.count for r in others) + keep} steps), the items stacks keep "
                    f"and this append of {n} steps; enlarge the store or lower the writers' "
                    "history"
                )
            lo, hi = self._overwritten(store, w)
            if lo >= hi:
                return w, moving, items, own_away
            moving = [r for r in others if r.first < hi and r.end > lo]
            items = []
            copied = sum(r.count for r in moving)
            for t in stacks:
                slots = t.index.live_in(lo % cap, hi - lo)
                if len(slots):
                    items.append((t, slots))
                    copied += int(t.index.spans(slots).sum())
            # Copies written before the append would separate own's steps from it.
            own_away = own_away or bool(keep and copied)
            target = n + (keep if own_away else 0) + copied
            if target == w:
                return w, moving, items, own_away
            w = target

    def blocking_table(self, store: RingStore, lo: int, hi: int) -> RowHolder | None:
        """A ``"block"`` table holding an item anchored on ids ``[lo, hi)``."""
        if lo >= hi:
            return None
        for t in self.tables():
            blocks = t.on_overwrite == "block" and t.index.size
            if blocks and t.index.any_live_in(lo % store.capacity, hi - lo):
                return t
        return None

    def has_room(self, n: int, own: Retention | None = None, keep: int = 0) -> bool:
        """Whether ``n`` steps could be appended now without waiting for a queue.

        Raises:
            InvalidArgumentError: as :meth:`make_room`.
        """
        store = self._store()
        nxt = store.next_id
        own_at_head = own is None or not keep or own.end == nxt
        if own_at_head and nxt + n <= store.capacity:  # as make_room: nothing overwritten
            return True
        w = self._plan(store, n, own, keep)[0]
        return self.blocking_table(store, *self._overwritten(store, w)) is None

    def make_room(
        self,
        n: int,
        own: Retention | None = None,
        keep: int = 0,
        successor: RowHolder | None = None,
    ) -> int | None:
        """Free the rows for ``n`` new steps at the head; returns the first row to write.

        Args:
            n: steps the caller writes next, in this lock hold, at ``store.next_id``.
            own: the appending writer's retention; its ``keep`` newest steps stay retained.
            successor: a table whose insert fills these rows; its items there stay for it to
                replace in this lock hold.

        Returns:
            The first row, or ``None`` when a queue's items hold a row: nothing changed, and the
            caller waits and calls again (:attr:`blocker` names the queue).

        Raises:
            InvalidArgumentError: if ``n`` exceeds the capacity, or the store cannot hold what
                writers retain plus the append; nothing changed then.
        """
        if self._stale:
            self.refresh()
        store = self._store()
        cap = store.capacity
        if n > cap:
            raise InvalidArgumentError(
                f"{n} steps cannot be appended to a store of capacity={cap}; append at most "
                f"{cap} at once"
            )
        nxt = store.next_id
        if own is None or not keep or own.first + own.count == nxt:  # own's steps at the head
            if nxt + n <= cap:
                return nxt  # nothing is overwritten
            only = self._only_retention
            if self._evict_only and (
                not self._retentions or (only is not None and own is not None and only() is own)
            ):
                if nxt >= cap and n == 1 and successor is None:  # one row: the common case
                    row = nxt % cap
                    for ref in self._tables:
                        t = ref()
                        if t is not None and t.index.size:
                            t.index.evict_rows(row, 1)
                    store.wake_waiters()
                    return row
                self._evict(store, nxt - cap, nxt + n - cap, n, successor)
                return nxt % cap
        w, moving, moved_items, own_away = self._plan(store, n, own, keep)
        lo, hi = self._overwritten(store, w)
        blocker = self.blocking_table(store, lo, hi)
        if blocker is not None:
            self.blocker = blocker.name
            return None
        # Nothing below waits or fails: read what moves, hand over, then write copies.
        copies = [(r, store.read_range(r.first, r.count)) for r in moving]
        items = []
        for t, slots in moved_items:
            for slot in slots.tolist():
                span, state = t.index.detach_for_move(slot)
                steps = store.read_rows((slot + np.arange(span)) % cap)
                items.append((t, slot, steps, state))
        own_data = store.read_range(own.end - keep, keep) if own_away else None
        if hi > lo:
            self._evict(store, lo, hi, n, successor, wake=False)
        for r, data in copies:
            r.first = store.write(data, r.count)
        new_slots = [store.write(steps, state[2]) % cap for _, _, steps, state in items]
        _move_items(items, new_slots)
        if own_away:
            own.first, own.count = store.write(own_data, keep), keep
        self.relocated_steps += w - n
        if hi > lo:
            store.wake_waiters()
        return store.next_id % cap

    def _evict(
        self,
        store: RingStore,
        lo: int,
        hi: int,
        n: int,
        successor: RowHolder | None,
        wake: bool = True,
    ) -> None:
        """Evicting tables remove their items on ids ``[lo, hi)``, but the successor's."""
        lo = max(lo, 0)
        if hi <= lo:
            return
        cap = store.capacity
        kept = 0 if successor is None else hi - max(lo, hi - n)
        for ref in self._tables:
            t = ref()
            if t is not None and t.on_overwrite == "evict" and t.index.size:
                t.index.evict_rows(lo % cap, hi - lo - (kept if t is successor else 0))
        if wake:
            store.wake_waiters()


def _move_items(items: list[tuple[RowHolder, int, Any, Any]], new_slots: list[int]) -> None:
    """Give each moved stack item its new slot, never onto one still occupied."""
    pending = dict(enumerate(items))
    olds = {(id(t), slot): i for i, (t, slot, _, _) in pending.items()}
    while pending:
        progressed = False
        for i in list(pending):
            t, old, _span, state = pending[i]
            new = new_slots[i]
            blocker = olds.get((id(t), new))
            if blocker is not None and blocker != i and blocker in pending:
                continue
            t.index.attach_moved(old, new, state)
            del pending[i]
            progressed = True
        if not progressed:  # cannot happen (moves never form a cycle); fail loudly
            raise RuntimeError("stack items could not be moved without a conflict")
