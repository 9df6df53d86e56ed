"""The replay table: items over a step store, a sampler, a remover and a rate limiter.

Every call validates all its arguments before it waits or changes anything.
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

    An *item* is an anchor step in the :class:`StepStore` plus a priority, a 64-bit key and a
    ``times_sampled`` count; its data is the :class:`ItemLayout`'s window from the anchor (at
    most one item per anchor). The sampler picks what :meth:`sample` returns, the remover what
    an insert over ``max_size`` evicts. Blocking calls wait at most ``timeout`` seconds in
    total (``None``: without limit, so a single thread can wait forever); someone must consume
    what the rate limiter holds back, and a call blocked over ``warn_after`` seconds logs one
    warning. Where actor and learner share one thread, use :meth:`can_insert` /
    :meth:`can_sample`. All methods are thread-safe; tables over one store share its lock.
    See docs/tables.md.

    Args:
        name: table name (used by servers, checkpoints and error messages).
        signature: step fields, when the table should create its own store.
        capacity: steps the table's own store keeps (default ``max_size``).
        capacity_bytes: instead of ``capacity``: bytes its own store and item index may take.
        store: an existing :class:`StepStore` to share with other tables.
        layout: item layout (default: one stored step per item).
        sampler: selector that samples (default :class:`Uniform`).
        remover: selector that evicts (default :class:`Fifo`).
        max_size: most items held (default: the store's capacity).
        rate_limiter: default ``MinSize(1)``.
        max_times_sampled: remove an item after this many samples (0: never).
        default_priority: priority of items inserted without one; ``None``: the largest seen
            (1.0 at first), as in PER.
        on_overwrite: for items on overwritten steps: ``"evict"``, ``"block"`` the store
            (queues), or ``"relocate"`` them to the head with new keys (stacks).
        seed: seed of the random generator; an int seed also fixes the key origin.
        warn_after: seconds before a blocked call logs one warning (``None``: the default,
            5 s); set ``table.warn_after = None`` to never warn.

    Raises:
        InvalidArgumentError: for inconsistent arguments.
        InsufficientMemoryError: if the store or item index does not fit in memory.
        DeadlockError: if the rate limiter could never admit a sample.

    Example:
        >>> table = Table("replay", signature={"obs": ((4,), "float32"), "reward": "float32"},
        ...               max_size=1000)
        >>> keys = table.insert({"obs": np.zeros((8, 4)), "reward": np.ones(8)})
        >>> table.sample(4).data["obs"].shape
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
        # The store's weak reference to this table: a sole table's one-row insert writes in place.
        self.store_ref: weakref.ref = store.attach(self)

    @classmethod
    def queue(cls, name: str, size: int, **kwargs: Any) -> Table:
        """A FIFO queue: each item sampled once, inserts block when ``size`` items wait.

        Someone must sample it, or inserts block up to their ``timeout``. Takes :class:`Table`'s
        keyword arguments.
        """
        return cls._ordered(name, size, Fifo, "block", kwargs)

    @classmethod
    def stack(cls, name: str, size: int, **kwargs: Any) -> Table:
        """A LIFO stack: like :meth:`queue` but the newest item is sampled first."""
        return cls._ordered(name, size, Lifo, "relocate", kwargs)

    @classmethod
    def _ordered(
        cls, name: str, size: int, selector: type, on_overwrite: str, kwargs: dict[str, Any]
    ) -> Table:
        """A table of ``size`` items, each sampled once, in ``selector``'s order."""
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

    @property
    def size(self) -> int:
        """Items held now."""
        return self.index.size

    @property
    def signature(self) -> Signature:
        """The steps' fields, as :meth:`insert` and writers take them."""
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
        """Whether :meth:`close` was called."""
        return self.admission.closed

    @property
    def warn_after(self) -> float | None:
        """Seconds a blocked call waits before it logs its warning (``None``: never)."""
        return self.admission.warn_after

    @warn_after.setter
    def warn_after(self, seconds: float | None) -> None:
        self.admission.warn_after = check_warn_after(seconds)

    def can_insert(self, num_inserts: int = 1) -> bool:
        """Whether inserting ``num_inserts`` items would proceed now without blocking.

        Raises:
            InvalidArgumentError: for ``num_inserts`` not an int >= 1.
        """
        num_inserts = check_count(num_inserts, "num_inserts")
        with self.mutex:
            rows = num_inserts * self.store.lanes if self._is_rows else 0
            return self.admission.can_insert(num_inserts, rows)

    def can_sample(self, num_samples: int = 1) -> bool:
        """Whether sampling ``num_samples`` items would proceed now without blocking or failing
        (False also when every item of a prioritized table has priority 0).

        Raises:
            InvalidArgumentError: for ``num_samples`` not an int in ``[1, max_size]``.
        """
        n = check_batch_size(num_samples, self.max_size, "num_samples")
        with self.mutex:
            return self.admission.can_sample(n)

    def insert(
        self,
        rows: Mapping[str, Any],
        priorities: Any = None,
        *,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Append rows to the store, each becoming its own item.

        Args:
            rows: dict of arrays, each ``[n, *shape]`` (or one row without the batch axis).
            priorities: ``n`` priorities, one for all, or ``None`` for the default.
            timeout: seconds > 0 to wait in all (rate limiter and store); ``None``: no limit.

        Returns:
            int64 keys of the new items.

        Raises:
            InvalidArgumentError: if the layout is not rows (use a writer), or on bad input.
            SignatureError: for rows the signature's casting rule refuses (a float into an
                int column, a value that overflows); float64 into float32 is rounded.
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
        # Rows that fit the store as they are get checked while written; others first.
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
        """Raise SignatureError for ``insert(rows)`` given a non-mapping."""
        fields = list(self.store.signature.fields)
        shown = ", ".join(f"{f!r}: ..." for f in fields[:4]) + (", ..." if len(fields) > 4 else "")
        raise SignatureError(
            f"insert takes rows as a mapping of field name -> array, e.g. {{{shown}}} for "
            f"table {self.name!r}; got {describe(rows)}"
        )

    def _store_rows(
        self, steps: Mapping[str, Any], n: int, one_row: bool, timeout: float | None
    ) -> int:
        """Admit ``n`` items and free ``n`` rows under one deadline, write rows; return first id."""
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

        ``length`` (default ``layout.span``) is for layouts with ``from_end``/``pad`` windows.

        Raises:
            InvalidArgumentError: if the window is not stored, an item is already there, or on
                a bad length or priority.
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
            InvalidArgumentError: as :meth:`create_item`, and for more than ``max_size`` anchors.
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
        """Slots of new items anchored at ``ids``; lock held. Raises InvalidArgumentError."""
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
        """Check ``n`` new items' priorities, lengths and ``anchors`` (lock held); return arrays.

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
        """Per-item extents as int64, or ``None`` for a fixed-span layout."""
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
        arr = arr.astype(np.int64, copy=False) if arr.ndim else np.full(n, arr.astype(np.int64))
        if n and (arr.min() < 1 or arr.max() > span):
            raise InvalidArgumentError(
                f"lengths={describe(arr.tolist())} must lie in [1, {span}] (the layout's span)"
            )
        return arr

    def sample(
        self, batch_size: int, *, timeout: float | None = None, buffers: Any = None
    ) -> Sample:
        """Draw ``batch_size`` items (with replacement for random samplers).

        Items reaching ``max_times_sampled`` are removed, so the batch may be shorter (never empty).

        Args:
            batch_size: items to draw, ``1 <= batch_size <= max_size``.
            timeout: seconds > 0 to wait for the rate limiter (``None``: no limit; 0 is refused,
                poll with :meth:`can_sample`).
            buffers: object whose ``empty(shape, dtype)`` returns an array no one else uses
                (default: the table's pool, which never touches a batch or view still held).

        Returns:
            :class:`Sample` with ``data`` (``[B, ...]`` per layout field) and ``info``.

        Raises:
            InvalidArgumentError: for a bad ``batch_size`` or ``timeout``.
            DeadlockError: if the rate limiter could never admit ``batch_size`` samples.
            RateLimiterTimeoutError: if the limiter blocked the sample for ``timeout``.
            EmptyTableError: at once, if no held item can be drawn (every priority 0 under
                ``Prioritized``).
            ClosedError: if the table is or gets closed.
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

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set new priorities; keys no longer held are skipped. The last duplicate wins.

        Returns:
            How many items were updated.

        Raises:
            InvalidArgumentError: for keys not made by this table or invalid priorities.
            ClosedError: if the table was closed.
        """
        with self.mutex:
            self._check_open("update_priorities")
            slots, prios = self.index.held(keys, priorities, "stale_updates")
            self.index.update(slots, prios)
            return len(slots)

    def delete(self, keys: Any) -> int:
        """Remove items; keys no longer held are skipped.

        Returns:
            How many items were removed.

        Raises:
            InvalidArgumentError: for keys not made by this table.
            ClosedError: if the table was closed.
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

    def reset(self) -> None:
        """Remove every item and zero the rate limiter's counts (stored steps stay)."""
        with self.mutex:
            self.reset_locked()
            self.store.wake_waiters()

    def reset_locked(self) -> None:
        """Core-internal: :meth:`reset` with ``mutex`` held (``StepStore.reset`` calls it)."""
        self.index.reset()
        self.rate_limiter.reset()

    def close(self) -> None:
        """Close the table: blocked and later blocking calls raise :class:`ClosedError`.

        Its items are dropped and stop holding rows (appends that waited for them go on);
        closing twice does nothing.
        """
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
        """Bytes of item bookkeeping."""
        return self.index.nbytes()

    def __len__(self) -> int:
        return self.index.size

    def __reduce_ex__(self, protocol: object) -> Any:
        """Refuse pickling (InvalidArgumentError): serve the table and pass a ``Client``."""
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
    """Whether step ids ``ids`` fall on distinct ``slots``."""
    if len(ids) < 2 or (ids[-1] - ids[0] < capacity and (ids[1:] > ids[:-1]).all()):
        return True
    return len(np.unique(slots)) == len(ids)
