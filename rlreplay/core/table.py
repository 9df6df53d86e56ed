"""The replay table: items over a step store, a sampler, a remover and a rate limiter.

:class:`Table` adds items two ways: :meth:`Table.insert` appends rows to the store, each
becoming its own item (the cpprb-style path), and :meth:`Table.create_items` makes items
over steps a writer has already appended. Every call validates all its arguments before
it waits or changes anything, and waits at most ``timeout`` seconds in total, for the
rate limiter and the store together. ``Table.queue`` and ``Table.stack`` are the named
constructors of the ordered tables.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core import memory, waiting
from rlreplay.core.admission import Admission, check_warn_after
from rlreplay.core.item_draws import DrawPlan
from rlreplay.core.item_index import SLOT_STATE, ItemIndex
from rlreplay.core.keys import check_priorities, generation_origin
from rlreplay.core.layout import ItemLayout
from rlreplay.core.rate_limiters import MinSize, Queue, RateLimiter
from rlreplay.core.sample import Sample
from rlreplay.core.selectors import Fifo, Lifo, Selector, Uniform
from rlreplay.core.specs import Signature
from rlreplay.core.storage import StepStore
from rlreplay.core.table_checks import (
    OVERWRITE_POLICIES,
    check_batch_size,
    check_components,
    check_table_limits,
    int_array,
    resolve_store,
    seeded_rng,
)
from rlreplay.core.table_info import TableInfo
from rlreplay.core.waiting import BlockedCall
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    SignatureError,
    check_count,
    check_timeout,
    describe,
)

__all__ = ["OVERWRITE_POLICIES", "SLOT_STATE", "Table"]


class Table:
    """A replay table: the central noun of rlreplay.

    An *item* is what a sampler picks: an anchor step in the table's :class:`StepStore`
    plus a priority, a 64-bit key and a ``times_sampled`` count. Its data is a window over
    the stored steps described by the table's :class:`ItemLayout` (rows, transitions,
    sequences), so steps are stored once however many items and tables read them. A table
    holds at most one item per anchor step.

    The *sampler* chooses which items :meth:`sample` returns; the *remover* chooses which
    item to evict when an insert would exceed ``max_size``. Items are also removed when
    they have been sampled ``max_times_sampled`` times, when deleted, and before the store
    overwrites their oldest step (or, with ``on_overwrite="block"``, the store waits).
    A table whose sampler and remover both ignore priorities (``Uniform``, ``Fifo``,
    ``Lifo``) keeps none, to save 8 bytes per item: the priorities it is given are
    checked, then dropped, and read back as 1.0 (``sample().info.priorities``, dataset
    exports); give it a ``Prioritized`` or heap selector to keep them.

    The *rate limiter* blocks inserts that run too far ahead of samples and samples that
    run too far ahead of inserts; every blocking call takes a ``timeout`` in seconds, the
    most it waits in total (for the limiter and the store together). Someone must consume
    what a blocking table holds back: a queue (:meth:`queue`) or a
    ``SampleToInsertRatio`` limiter blocks inserts until a sampler catches up, and a
    ``min_size_to_sample`` blocks samples until writers have inserted that many items. A
    call blocked for more than ``warn_after`` seconds logs one warning on the
    ``"rlreplay"`` logger naming the table, the limiter's state and the likely cause; use
    :meth:`can_insert` / :meth:`can_sample` where actor and learner share one thread.
    All methods are thread-safe; tables over one store share its lock.

    A table is composed of parts that own their state: its :class:`ItemIndex`
    (``table.index``: per-slot records, live flags, sampler, remover, size, counters), its
    :class:`DrawPlan` (``table.draws``: which rows a sample reads, batch buffers) and its
    rate limiter; the store's :class:`~rlreplay.core.overwrite.OverwriteProtocol` hands
    over rows the store overwrites. ``close()`` detaches the table from its store (its
    items no longer hold rows); the store holds its tables weakly, so a dropped table
    stops holding rows as well.

    Args:
        name: table name (used by servers, checkpoints and error messages).
        signature: step fields, when the table should create its own store.
        capacity: steps the table's own store keeps (default ``max_size``).
        capacity_bytes: instead of ``capacity``: the bytes the table's own store and its
            item index may take together; the capacity (and the default ``max_size``) is
            the most steps that fit (see :mod:`rlreplay.core.memory`).
        store: an existing :class:`StepStore` to share with other tables.
        layout: item layout (default: one stored step per item, field by field).
        sampler: selector that samples (default :class:`Uniform`).
        remover: selector that evicts (default :class:`Fifo`).
        max_size: most items held (default: the store's capacity).
        rate_limiter: default ``MinSize(1)``.
        max_times_sampled: remove an item after this many samples (0: never).
        default_priority: priority of items inserted without one; ``None`` uses the largest
            priority inserted or updated so far (1.0 at first), the PER convention.
        on_overwrite: ``"evict"`` removes items whose steps the store overwrites;
            ``"block"`` makes the store wait until they are consumed (queues);
            ``"relocate"`` copies their steps to the head of the store and moves them
            there, keeping their place in the order but getting new keys (stacks, whose
            oldest items wait longest).
        seed: seed of the table's random generator. An int seed also fixes the table's
            key origin (with its name), so a seeded run issues the same keys; without
            one the origin is random. Either way, tables with different names (or
            without seeds) issue different keys, and keys of one are refused by another
            (see rlreplay/core/keys.py for the exact guarantee).
        warn_after: seconds a blocked call waits before it logs its one warning; default
            (``None``) ``rlreplay.core.waiting.WARN_AFTER_S`` (5 s). Set
            ``table.warn_after = None`` to never warn.

    Raises:
        InvalidArgumentError: for inconsistent arguments (each message says which).
        InsufficientMemoryError: if the store or the item index needs more memory than is
            available; nothing is allocated.
        DeadlockError: if the rate limiter's ``min_size_to_sample`` exceeds ``max_size``, or
            it wants more samples per insert than ``max_times_sampled`` allows.

    Example:
        >>> table = Table("replay", signature={"obs": ((4,), "float32"), "reward": "float32"},
        ...               max_size=1000)
        >>> keys = table.insert({"obs": np.zeros((8, 4)), "reward": np.ones(8)})
        >>> batch = table.sample(4)
        >>> batch.data["obs"].shape
        (4, 4)
    """

    def __init__(
        self,
        name: str = "table",
        *,
        signature: Mapping[str, Any] | Signature | None = None,
        capacity: int | None = None,
        capacity_bytes: int | None = None,
        store: StepStore | None = None,
        layout: ItemLayout | None = None,
        sampler: Selector | None = None,
        remover: Selector | None = None,
        max_size: int | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int = 0,
        default_priority: float | None = None,
        on_overwrite: str = "evict",
        seed: int | None = None,
        warn_after: float | None = None,
    ):
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"name={describe(name)} must be a non-empty string")
        if capacity_bytes is not None:
            capacity = memory.table_rows(
                signature, capacity, store, capacity_bytes, sampler, remover, layout, max_size
            )
        store = resolve_store(signature, capacity, store, max_size)
        self.name = name
        self.store = store
        self.layout = layout if layout is not None else ItemLayout.rows(store.signature)
        cap = store.capacity
        self.max_size = check_table_limits(
            store, self.layout, max_size, max_times_sampled, on_overwrite, default_priority
        )
        warn_after = waiting.WARN_AFTER_S if warn_after is None else check_warn_after(warn_after)
        sampler = sampler if sampler is not None else Uniform()
        remover = remover if remover is not None else Fifo()
        self.rate_limiter = rate_limiter if rate_limiter is not None else MinSize(1)
        check_components(sampler, remover, self.rate_limiter, self.max_size, max_times_sampled)
        memory.check_index(self, cap, sampler, remover, self.layout.variable, self.max_size)
        self.max_times_sampled = max_times_sampled
        self.on_overwrite = on_overwrite
        self.rng = seeded_rng(seed)
        self.index = ItemIndex(
            cap,
            sampler,
            remover,
            self.max_size,
            self.layout.span,
            self.layout.variable,
            default_priority,
            self.rng,
            generation_origin(seed, name),
        )
        if default_priority is not None:
            self.index.check_priority_range(np.array([float(default_priority)]), "default_priority")
        self.draws = DrawPlan(self.index, store, self.layout, max_times_sampled)
        self.admission = Admission(
            name, self.rate_limiter, self.index, store, max_times_sampled, warn_after
        )
        self.mutex = store.mutex
        self._is_rows = self.layout.is_rows
        # The weak reference the store keeps of this table: the one-row insert writes in
        # place when it is the overwrite protocol's ``sole``.
        self.store_ref: weakref.ref = store.attach(self)

    # ------------------------------------------------------------ constructors
    @classmethod
    def queue(cls, name: str, size: int, **kwargs: Any) -> Table:
        """A FIFO queue: each item sampled once, inserts block when ``size`` items wait.

        Someone must sample the queue: with ``size`` items waiting, inserts (and appends
        to the store that would overwrite waiting items) block until a sampler takes one,
        up to their ``timeout``; a call blocked longer than ``warn_after`` seconds logs
        "no sampler is consuming this queue". Takes the same keyword arguments as
        :class:`Table` (``signature``/``store``, ``layout``, ...); with ``signature`` the
        queue's own store holds ``size`` items of the layout's span, plus one item's
        steps for the writer, so ``size`` items really fit.
        """
        return cls._ordered(name, size, Fifo, "block", kwargs)

    @classmethod
    def stack(cls, name: str, size: int, **kwargs: Any) -> Table:
        """A LIFO stack: like :meth:`queue` but the newest item is sampled first (the
        oldest items wait longest: when the store wraps, their steps are copied to its
        head instead of blocking writers)."""
        return cls._ordered(name, size, Lifo, "relocate", kwargs)

    @classmethod
    def _ordered(
        cls, name: str, size: int, selector: type, on_overwrite: str, kwargs: dict[str, Any]
    ) -> Table:
        """A table of ``size`` items, each sampled once, in ``selector``'s order; a table
        creating its own store sizes it for ``size`` items of its layout's span plus one."""
        own_store = "store" not in kwargs and "capacity_bytes" not in kwargs
        if "signature" in kwargs and own_store and isinstance(size, int):
            layout = kwargs.get("layout")
            span = layout.span if isinstance(layout, ItemLayout) else 1
            kwargs.setdefault("capacity", max(2 * size, (size + 1) * span))
        return cls(
            name,
            sampler=selector(),
            remover=selector(),
            max_size=size,
            max_times_sampled=1,
            rate_limiter=Queue(size),
            on_overwrite=on_overwrite,
            **kwargs,
        )

    # ------------------------------------------------------------ the parts
    @property
    def size(self) -> int:
        """Items held now."""
        return self.index.size

    @property
    def signature(self) -> Signature:
        """The steps' fields: its store's signature, what :meth:`insert` and writers take
        (and ``Client.signature(name)`` returns for a served table). A sample's fields are
        the layout's (``table.layout``: e.g. ``next_obs`` of a transition)."""
        return self.store.signature

    @property
    def sampler(self) -> Selector:
        return self.index.sampler

    @property
    def remover(self) -> Selector:
        return self.index.remover

    @property
    def default_priority(self) -> float | None:
        return self.index.default_priority

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (blocking calls then raise ClosedError)."""
        return self.admission.closed

    @property
    def warn_after(self) -> float | None:
        """Seconds a blocked call waits before it logs its one warning (``None``: never)."""
        return self.admission.warn_after

    @warn_after.setter
    def warn_after(self, seconds: float | None) -> None:
        self.admission.warn_after = check_warn_after(seconds)

    def can_insert(self, num_inserts: int = 1) -> bool:
        """Whether inserting ``num_inserts`` items would proceed now without blocking: the
        rate limiter admits them and, for :meth:`insert` (tables of rows), the store can
        take their rows without waiting for a queue's items.

        Raises:
            InvalidArgumentError: for ``num_inserts`` not an int >= 1.
        """
        num_inserts = check_count(num_inserts, "num_inserts")
        with self.mutex:
            rows = num_inserts * self.store.lanes if self._is_rows else 0
            return self.admission.can_insert(num_inserts, rows)

    def can_sample(self, num_samples: int = 1) -> bool:
        """Whether sampling ``num_samples`` items would proceed now without blocking or
        failing (False also when every item of a prioritized table has priority 0).

        Raises:
            InvalidArgumentError: for ``num_samples`` that :meth:`sample` refuses as a
                ``batch_size`` (not an int in ``[1, max_size]``).
        """
        n = check_batch_size(num_samples, self.max_size, "num_samples")
        with self.mutex:
            return self.admission.can_sample(n)

    # ----------------------------------------------------------------- inserts
    def insert(
        self,
        rows: Mapping[str, Any],
        priorities: Any = None,
        *,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Append rows to the store, each becoming its own item (the cpprb-style fast path).

        Args:
            rows: dict of arrays, each ``[n, *shape]`` (or one row without the batch axis).
            priorities: ``n`` priorities, one for all, or ``None`` for the default priority.
            timeout: seconds this call may wait in all, for the rate limiter and for a
                queue's items in the store; ``None`` waits without limit.

        Returns:
            int64 keys of the new items.

        Raises:
            InvalidArgumentError: if the table's layout is not rows (use a writer), or on
                bad rows or priorities; nothing is stored then.
            RateLimiterTimeoutError: if the limiter blocked the insert for ``timeout``.
            ReplayTimeoutError: if a queue's items kept the store from taking the rows.
            ClosedError: if the table is or gets closed.
        """
        if not self._is_rows:
            raise InvalidArgumentError(
                f"table {self.name!r} has items spanning {self.layout.span} steps; insert() "
                "stores one row per item, so append steps with a TrajectoryWriter instead"
            )
        store = self.store
        # Rows that may fit the store as they are (one row, or a dict of arrays of one
        # length) are checked while they are written; others are validated first.
        one_row, n = store.signature.row_count(rows)
        steps = rows
        if n is None:
            if type(rows) is not dict and not isinstance(rows, Mapping):
                self._raise_not_a_mapping(rows)
            steps, n = store.signature.check_batch(rows, "rows")
        if n < 1 or n > self.max_size or n % store.lanes:
            raise InvalidArgumentError(
                f"rows hold {n} rows; insert between 1 and max_size={self.max_size} at once"
                + (f", a multiple of lanes={store.lanes}" if store.lanes > 1 else "")
            )
        prios = None if priorities is None else check_priorities(priorities, n)
        if prios is not None:
            self.index.check_priority_range(prios)
        timeout = check_timeout(timeout)
        limiter = self.rate_limiter
        limiter.check_insert_batch(n)
        index = self.index
        with self.mutex:
            first = None
            if (
                store.overwrite.sole is self.store_ref
                and not self.admission.closed
                and limiter.can_insert(n, index.size)
            ):
                first = store.write(steps, n, one_row=one_row, checked=False)  # alone: no hand-over
            if first is None:
                if steps is rows:  # validate before waiting or changing anything
                    if one_row:
                        steps = store.signature.check_row(rows, "rows")
                    else:
                        steps, n = store.signature.check_batch(rows, "rows")
                first = self._store_rows(steps, n, one_row, timeout)
            start = first % store.capacity
            if start + n <= store.capacity:
                keys = index.claim(np.arange(start, start + n), prios, start)
            else:
                keys = index.claim(np.arange(first, first + n) % store.capacity, prios)
            limiter.inserts += n
            store.wake_waiters()
        return keys

    def _raise_not_a_mapping(self, rows: Any) -> None:
        """Raise the error for ``insert(rows)`` given something other than a mapping (a
        tuple of arrays, one array), naming this table's fields.

        Raises:
            SignatureError: always.
        """
        fields = list(self.store.signature.fields)
        shown = ", ".join(f"{f!r}: ..." for f in fields[:4]) + (", ..." if len(fields) > 4 else "")
        raise SignatureError(
            f"insert takes rows as a mapping of field name -> array, e.g. {{{shown}}} for "
            f"table {self.name!r}; got {describe(rows)}"
        )

    def _store_rows(
        self, steps: Mapping[str, Any], n: int, one_row: bool, timeout: float | None
    ) -> int:
        """Admit ``n`` items through the rate limiter and free ``n`` rows in the store,
        waiting for either as needed (one deadline for both), then write the validated
        rows; returns the first id (this table's own items on those rows are left for
        the caller to replace, in this lock hold)."""
        store = self.store
        waiter: BlockedCall | None = None
        while True:
            waiter = self.admission.admit(n, waiter, timeout)
            if store.overwrite.make_room(n, successor=self) is not None:
                first = store.write(steps, n, one_row=one_row)
                if waiter is not None:
                    waiter.settle()
                return first
            waiter = waiter or self.admission.blocked_call(timeout, "insert")
            if not waiter.wait():
                waiter.settle()
                raise store.timeout_error(n, timeout)

    def create_item(
        self,
        anchor_id: int,
        priority: float | None = None,
        *,
        length: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Create one item anchored at stored step ``anchor_id``; returns its key.

        Writers call this; the item reads ``layout.span`` steps from the anchor (every
        ``store.lanes`` ids), all of which must be stored. ``length`` (the item's extent,
        ``1 <= length <= layout.span``) is for layouts with ``from_end``/``pad`` windows;
        it defaults to ``layout.span``.

        Raises:
            InvalidArgumentError: if the window is not fully stored, the table already holds
                an item at that anchor, the length or the priority is invalid.
            RateLimiterTimeoutError: if the limiter blocked the insert for ``timeout``.
        """
        try:
            if isinstance(anchor_id, bool):
                raise TypeError
            anchor = operator.index(anchor_id)
        except TypeError:
            raise InvalidArgumentError(
                f"anchor_id={describe(anchor_id)} must be an int (a store step id)"
            ) from None
        lengths = None if length is None else (length,)
        keys = self.create_items((anchor,), priority, lengths=lengths, timeout=timeout)
        return int(keys[0])

    def create_items(
        self,
        anchor_ids: Any,
        priorities: Any = None,
        *,
        lengths: Any = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Batch form of :meth:`create_item`; returns the new keys.

        Raises:
            InvalidArgumentError: as :meth:`create_item`, and for more than ``max_size``
                anchors at once (the remover could not make room for them).
        """
        ids = int_array(anchor_ids, "anchor_ids")
        n = len(ids)
        if n > self.max_size:
            raise InvalidArgumentError(
                f"anchor_ids holds {n} anchors, more than max_size={self.max_size} of table "
                f"{self.name!r}; create at most max_size items at once"
            )
        prios, extents = self.check_items(n, priorities, lengths)
        timeout = check_timeout(timeout)
        store = self.store
        index = self.index
        limiter = self.rate_limiter
        with self.mutex:
            if self.admission.closed or not limiter.can_insert(n, index.size):
                if n:
                    self._anchor_slots(ids, extents)  # bad anchors are refused before any wait
                waiter = self.admission.admit(n, None, timeout)
                if waiter is not None:
                    waiter.settle()
            if n == 0:
                return np.zeros(0, dtype=np.int64)
            slots = self._anchor_slots(ids, extents)
            keys = index.claim(slots, prios)
            if extents is not None:
                index.extent[slots] = extents
            limiter.inserts += n
            store.wake_waiters()
            return keys

    def _anchor_slots(self, ids: np.ndarray, extents: np.ndarray | None) -> np.ndarray:
        """The slots of new items anchored at steps ``ids`` (int64, at least one) of
        ``extents`` steps each (``None``: the layout's span), lock held.

        Raises:
            InvalidArgumentError: if a window reaches outside the stored steps, the table
                holds an item anchored there, or two anchors share a slot.
        """
        store = self.store
        reach = self.layout.span - 1 if extents is None else extents - 1
        last = ids + reach * store.lanes
        if ids.min() < store.oldest_id or last.max() >= store.next_id:
            raise InvalidArgumentError(
                f"anchor ids {describe(ids.tolist())} with span {self.layout.span} reach "
                f"outside the stored steps [{store.oldest_id}, {store.next_id}); create "
                "items only over steps already appended and not yet overwritten"
            )
        slots = ids % store.capacity
        if self.index.live[slots].any() or not _distinct(ids, slots, store.capacity):
            raise InvalidArgumentError(
                f"table {self.name!r} already holds an item anchored at one of steps "
                f"{describe(ids.tolist())}; a table holds at most one item per anchor step"
            )
        return slots

    def check_items(
        self, n: int, priorities: Any = None, lengths: Any = None, anchors: Any = None
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Check the priorities and lengths of ``n`` new items, as :meth:`create_items`
        takes them, and (with the lock held) their ``anchors`` if given; returns the
        priorities and lengths as arrays (``None`` where not given, and lengths on a
        fixed-span layout). Writers call it before they wait for the rate limiter.

        Raises:
            InvalidArgumentError: for a bad priority, length or anchor.
        """
        prios = None if priorities is None else check_priorities(priorities, n)
        self.index.check_priority_range(prios)
        extents = self._extents(lengths, n)
        if anchors is not None and n:
            self._anchor_slots(np.asarray(anchors, dtype=np.int64), extents)
        return prios, extents

    def _extents(self, lengths: Any, n: int) -> np.ndarray | None:
        """Per-item extents as int64 (``span`` when not given), for a layout with
        per-item extents; ``None`` for a fixed-span layout.

        Raises:
            InvalidArgumentError: for lengths on a fixed-span layout or outside ``[1, span]``.
        """
        span = self.layout.span
        if self.index.extent is None:
            if lengths is not None:
                raise InvalidArgumentError(
                    f"lengths were given but table {self.name!r} has a fixed-span layout; "
                    "per-item lengths need from_end or pad windows"
                )
            return None
        if lengths is None:
            return np.full(n, span, dtype=np.int64)
        arr = np.asarray(lengths)
        if arr.dtype.kind not in "iu" or arr.shape not in ((), (n,)):
            raise InvalidArgumentError(
                f"lengths={describe(lengths)} must be {n} ints (one per item) or one int"
            )
        # One per item: as int64 (no copy when it is already); one for all: filled.
        arr = arr.astype(np.int64, copy=False) if arr.ndim else np.full(n, arr.astype(np.int64))
        if n and (arr.min() < 1 or arr.max() > span):
            raise InvalidArgumentError(
                f"lengths={describe(arr.tolist())} must lie in [1, {span}] (the layout's span)"
            )
        return arr

    # ----------------------------------------------------------------- sampling
    def sample(
        self, batch_size: int, *, timeout: float | None = None, buffers: Any = None
    ) -> Sample:
        """Draw ``batch_size`` items (with replacement for random samplers).

        A batch behaves as ``batch_size`` consecutive single samples: an item that reaches
        ``max_times_sampled`` is removed and not returned again. If every item is used up
        before the batch is full, the batch is shorter (it holds at least one item); the
        rate limiter counts only the items returned.

        Args:
            batch_size: items to draw, ``1 <= batch_size <= max_size``.
            timeout: seconds to wait for the rate limiter (``None``: without limit).
            buffers: where the batch's arrays are written: an object whose
                ``empty(shape, dtype)`` returns an array no one else uses (a server
                gathers straight into a client's shared memory this way); default: the
                table's reusable output arrays.

        Returns:
            :class:`Sample` with ``data`` (``[B, ...]`` per layout field) and ``info``.

        Raises:
            InvalidArgumentError: for a bad ``batch_size`` (a bool included) or ``timeout``.
            DeadlockError: if the rate limiter could never admit ``batch_size`` samples.
            RateLimiterTimeoutError: if the limiter blocked the sample for ``timeout``.
            ClosedError: if the table was closed while waiting.
        """
        n = check_batch_size(batch_size, self.max_size)
        timeout = check_timeout(timeout)
        limiter, index = self.rate_limiter, self.index
        limiter.check_sample_batch(n, index.size)
        with self.mutex:
            if self.closed or not (index.size > 0 and limiter.can_sample(n, index.size)):
                self.admission.admit_samples(n, timeout)
            sample = self.draws.draw(n, buffers)
            limiter.samples += len(sample.info.keys)
            self.store.wake_waiters()
            return sample

    # ------------------------------------------------------ priorities, deletes
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set new priorities; keys of items no longer held are skipped and counted.

        A table that keeps no priorities (sampler and remover both ignore them, see the
        class docstring) checks them and drops them.

        Duplicate keys: the last priority given wins.

        Returns:
            How many items were updated.

        Raises:
            InvalidArgumentError: for keys not made by this table or invalid priorities.
            ClosedError: if the table was closed (its items were dropped).
        """
        with self.mutex:
            self._check_open("update_priorities")
            slots, prios = self.index.held(keys, priorities, "stale_updates")
            self.index.update(slots, prios)
            return len(slots)

    def delete(self, keys: Any) -> int:
        """Remove items; keys of items no longer held are skipped and counted.

        Returns:
            How many items were removed.

        Raises:
            InvalidArgumentError: for keys not made by this table.
            ClosedError: if the table was closed (its items were dropped).
        """
        with self.mutex:
            self._check_open("delete")
            slots, _ = self.index.held(keys, None, "stale_deletes")
            if len(slots):
                self.index.remove(slots)
                self.index.counts["deletes"] += len(slots)
                self.store.wake_waiters()
            return len(slots)

    def _check_open(self, call: str) -> None:
        if self.closed:
            raise ClosedError(f"{call} on table {self.name!r}, which is closed")

    # ----------------------------------------------------------- housekeeping
    def reset(self) -> None:
        """Remove every item and zero the rate limiter's counts (stored steps stay)."""
        with self.mutex:
            self.reset_locked()
            self.store.wake_waiters()

    def reset_locked(self) -> None:
        """:meth:`reset` with ``mutex`` held (core-internal: ``StepStore.reset`` calls it
        for every table over the store)."""
        self.index.reset()
        self.rate_limiter.reset()

    def close(self) -> None:
        """Close the table: every blocked call (inserts waiting in the store included)
        wakes with :class:`ClosedError`, later calls that may block raise it, and the
        table detaches from its store, dropping its items, so they no longer hold rows
        (appends that waited for a closed queue go on). Closing twice does nothing."""
        with self.mutex:
            if self.closed:
                return
            self.admission.closed = True
            self.index.reset()
            self.store.detach(self)
            self.store.waits.wake_all()

    def info(self) -> TableInfo:
        """A snapshot of the table's counters and configuration."""
        with self.mutex:
            lim, index = self.rate_limiter, self.index
            return TableInfo(
                name=self.name,
                size=index.size,
                max_size=self.max_size,
                store_capacity=self.store.capacity,
                stored_steps=self.store.num_steps,
                sampler=repr(index.sampler),
                remover=repr(index.remover),
                rate_limiter=lim.config(),
                max_times_sampled=self.max_times_sampled,
                inserts=lim.inserts,
                samples=lim.samples,
                insert_blocked_s=lim.insert_blocked_s,
                sample_blocked_s=lim.sample_blocked_s,
                index_bytes=index.nbytes(),
                **index.counts,
            )

    def index_nbytes(self) -> int:
        """Bytes of item bookkeeping (per-slot state, sampler and remover indexes)."""
        return self.index.nbytes()

    def __len__(self) -> int:
        return self.index.size

    def __reduce_ex__(self, protocol: object) -> Any:
        """A table is not pickled (nor copied): it lives in one process, with its lock,
        its store's memory and the waits of its blocked calls.

        Raises:
            InvalidArgumentError: saying to serve the table and hand other processes a
                ``Client``, which pickles as its address.
        """
        raise InvalidArgumentError(
            f"table {self.name!r} cannot be pickled or copied: a Table lives in one process. "
            "To use it from another process, serve it (server = rlreplay.Server([table])"
            ".start()) and pass rlreplay.Client(server.address) instead, which pickles as "
            "its address"
        )

    def __repr__(self) -> str:
        return (
            f"Table({self.name!r}, size={self.size}/{self.max_size}, sampler={self.sampler!r}, "
            f"remover={self.remover!r}, {self.rate_limiter!r})"
        )


def _distinct(ids: np.ndarray, slots: np.ndarray, capacity: int) -> bool:
    """Whether step ids ``ids`` fall on distinct ``slots``: increasing ids spanning less than
    ``capacity`` do (what writers create, checked in one pass), others are counted."""
    if len(ids) < 2 or (ids[-1] - ids[0] < capacity and (ids[1:] > ids[:-1]).all()):
        return True
    return len(np.unique(slots)) == len(ids)
