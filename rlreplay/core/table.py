"""The replay table: items over a step store, a sampler, a remover and a rate limiter."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.batch_buffers import BatchBuffers
from rlreplay.core.item_draws import ItemDraws
from rlreplay.core.item_slots import ItemSlots
from rlreplay.core.keys import check_priorities
from rlreplay.core.layout import ItemLayout
from rlreplay.core.rate_limiters import MinSize, Queue, RateLimiter
from rlreplay.core.sample import Sample
from rlreplay.core.selectors import Fifo, Lifo, Selector, Uniform
from rlreplay.core.specs import Signature
from rlreplay.core.storage import StepStore
from rlreplay.core.table_checks import check_components, check_timeout
from rlreplay.core.table_info import TableInfo
from rlreplay.core.table_inserts import TableInserts
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    RateLimiterTimeoutError,
    describe,
)

OVERWRITE_POLICIES = ("evict", "block", "relocate")
# Per-slot item state (the compiled loops in _draws.c and _slots.c rely on this layout).
SLOT_STATE = np.dtype([("priority", "<f8"), ("generation", "<u4"), ("times_sampled", "<u4")])


class Table(TableInserts, ItemSlots, ItemDraws):
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

    The *rate limiter* blocks inserts that run too far ahead of samples and samples that
    run too far ahead of inserts; every blocking call takes a ``timeout`` in seconds.
    All methods are thread-safe; tables over one store share its lock.

    Args:
        name: table name (used by servers, checkpoints and error messages).
        signature: step fields, when the table should create its own store.
        capacity: steps the table's own store keeps (default ``max_size``).
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
        seed: seed of the table's random generator.

    Raises:
        InvalidArgumentError: for inconsistent arguments (each message says which).
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
    ):
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"name={describe(name)} must be a non-empty string")
        if store is None:
            if signature is None:
                raise InvalidArgumentError(
                    "give either store= (to share steps) or signature= (to own a store)"
                )
            size = capacity if capacity is not None else max_size
            if size is None:
                raise InvalidArgumentError("give capacity= or max_size= with signature=")
            store = StepStore(signature, size)
        elif signature is not None and Signature(signature) != store.signature:
            raise InvalidArgumentError("signature= differs from store.signature; pass one")
        self.name = name
        self.store = store
        self.layout = layout if layout is not None else ItemLayout.rows(store.signature)
        if self.layout.signature != store.signature:
            raise InvalidArgumentError("layout was built for another signature than the store's")
        if self.layout.span * store.lanes > store.capacity:
            raise InvalidArgumentError(
                f"items span {self.layout.span} steps, more than the store's "
                f"{store.capacity // store.lanes} steps per lane; enlarge the store"
            )
        cap = store.capacity
        self.max_size = cap if max_size is None else max_size
        if not isinstance(self.max_size, (int, np.integer)) or not 1 <= self.max_size <= cap:
            raise InvalidArgumentError(
                f"max_size={describe(max_size)} must be an int in [1, {cap}]: a table holds "
                "at most one item per stored step"
            )
        if not isinstance(max_times_sampled, int) or max_times_sampled < 0:
            raise InvalidArgumentError(
                f"max_times_sampled={describe(max_times_sampled)} must be an int >= 0 (0: no limit)"
            )
        if on_overwrite not in OVERWRITE_POLICIES:
            raise InvalidArgumentError(
                f"on_overwrite={on_overwrite!r} is unknown; choose one of {OVERWRITE_POLICIES}"
            )
        if on_overwrite == "relocate" and store.lanes != 1:
            raise InvalidArgumentError(
                f"on_overwrite='relocate' needs a single-lane store; this one has "
                f"lanes={store.lanes}"
            )
        if default_priority is not None:
            check_priorities(default_priority, 1, "default_priority")
        self.sampler = sampler if sampler is not None else Uniform()
        self.remover = remover if remover is not None else Fifo()
        self.rate_limiter = rate_limiter if rate_limiter is not None else MinSize(1)
        check_components(
            self.sampler, self.remover, self.rate_limiter, self.max_size, max_times_sampled
        )
        self.max_times_sampled = max_times_sampled
        self.default_priority = default_priority
        self.on_overwrite = on_overwrite
        self.rng = np.random.default_rng(seed)

        # Per-slot item state; slot == the anchor step's row in the store.
        # One 16-byte record per slot, so a sampled item's state is one cache line, not
        # three; ``_priority``, ``_generation`` and ``_times_sampled`` are views of its fields
        # and ``_slot_bytes`` its bytes, as the compiled loops take them.
        self._slot_state = np.zeros(cap, dtype=SLOT_STATE)
        self._priority = self._slot_state["priority"]
        self._generation = self._slot_state["generation"]
        self._times_sampled = self._slot_state["times_sampled"]
        self._slot_bytes = self._slot_state.view(np.uint8)
        self._live = np.zeros(cap, dtype=bool)
        # Memoryviews of the same arrays: one-slot reads and writes through them cost a
        # third of numpy's scalar indexing (the one-row insert does several).
        self._slot_views = tuple(
            memoryview(a) for a in (self._generation, self._priority, self._times_sampled)
        )
        self._live_view = memoryview(self._live)
        # Per-item extent (stored steps covered), only for layouts whose windows use it.
        self._extent = np.zeros(cap, dtype=np.int32) if self.layout.variable else None
        self.sampler.bind(cap)
        self.remover.bind(cap)
        self.size = 0
        self._max_priority = 1.0
        self._counts = dict.fromkeys(
            (
                "deletes",
                "evictions",
                "overwrite_evictions",
                "relocations",
                "stale_updates",
                "stale_deletes",
            ),
            0,
        )
        self._closed = False
        self.lock = store.lock
        self.mutex = store.mutex
        self._is_rows = self.layout.is_rows
        # While insert() appends, the items it overwrites keep their selector entries
        # (``_deferred`` = (first slot, count)) so the new items can take them over.
        self._inserting = False
        self._deferred: tuple[int, int] | None = None
        self._gather_plan = self._plan_gather()
        self._batch_buffers = BatchBuffers()
        first_path, first_spec = next(iter(store.signature.fields.items()))
        # insert() tells one row from a batch by the first field's number of dimensions.
        self._row_probe = None if "/" in first_path else (first_path, len(first_spec.shape))
        store.attach(self)

    # ------------------------------------------------------------ constructors
    @classmethod
    def queue(cls, name: str, size: int, **kwargs: Any) -> Table:
        """A FIFO queue: each item sampled once, inserts block when ``size`` items wait.

        Takes the same keyword arguments as :class:`Table` (``signature``/``store``, ...).
        """
        return cls._ordered(name, size, Fifo, "block", **kwargs)

    @classmethod
    def stack(cls, name: str, size: int, **kwargs: Any) -> Table:
        """A LIFO stack: like :meth:`queue` but the newest item is sampled first."""
        return cls._ordered(name, size, Lifo, "relocate", **kwargs)

    @classmethod
    def _ordered(
        cls, name: str, size: int, selector: type, on_overwrite: str, **kwargs: Any
    ) -> Table:
        if "signature" in kwargs and "store" not in kwargs:
            kwargs.setdefault("capacity", size * 2)
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

    # ---------------------------------------------------------------- waiting
    def _wait_for(self, allowed, timeout: float | None, what: str, counter: str) -> None:
        """Wait on the store's condition until ``allowed()``; called with the lock held."""
        if self._closed:
            raise ClosedError(f"table {self.name!r} is closed")
        if allowed():
            return
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        try:
            while not allowed():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise RateLimiterTimeoutError(
                        f"{what} on table {self.name!r} was blocked by its rate limiter for "
                        f"{timeout}s (size={self.size}, inserts={self.rate_limiter.inserts}, "
                        f"samples={self.rate_limiter.samples}, {self.rate_limiter!r})"
                    )
                self.lock.wait(remaining)
                if self._closed:
                    raise ClosedError(f"table {self.name!r} was closed while {what} waited")
        finally:
            limiter = self.rate_limiter
            setattr(limiter, counter, getattr(limiter, counter) + time.monotonic() - start)

    def can_insert(self, num_inserts: int = 1) -> bool:
        """Whether inserting ``num_inserts`` items would proceed now without blocking."""
        with self.mutex:
            return self.rate_limiter.can_insert(num_inserts, self.size)

    def can_sample(self, num_samples: int = 1) -> bool:
        """Whether sampling ``num_samples`` items would proceed now without blocking or
        failing (False also when every item of a prioritized table has priority 0)."""
        with self.mutex:
            return (
                self.size > 0
                and self.rate_limiter.can_sample(num_samples, self.size)
                and self.sampler.has_candidates()
            )

    # ----------------------------------------------------------------- sampling
    def sample(self, batch_size: int, *, timeout: float | None = None) -> Sample:
        """Draw ``batch_size`` items (with replacement for random samplers).

        A batch behaves as ``batch_size`` consecutive single samples: an item that reaches
        ``max_times_sampled`` is removed and not returned again. If every item is used up
        before the batch is full, the batch is shorter (it holds at least one item); the
        rate limiter counts only the items returned.

        Args:
            batch_size: items to draw, ``1 <= batch_size <= max_size``.
            timeout: seconds to wait for the rate limiter (``None``: without limit).

        Returns:
            :class:`Sample` with ``data`` (``[B, ...]`` per layout field) and ``info``.

        Raises:
            InvalidArgumentError: for a bad ``batch_size`` or ``timeout``.
            DeadlockError: if the rate limiter could never admit ``batch_size`` samples.
            RateLimiterTimeoutError: if the limiter blocked the sample for ``timeout``.
            ClosedError: if the table was closed while waiting.
        """
        if not isinstance(batch_size, (int, np.integer)) or not 1 <= batch_size <= self.max_size:
            raise InvalidArgumentError(
                f"batch_size={describe(batch_size)} must be an int in [1, max_size={self.max_size}]"
            )
        n = int(batch_size)
        timeout = check_timeout(timeout)
        self.rate_limiter.check_sample_batch(n, self.size)
        limiter = self.rate_limiter
        with self.mutex:
            if self._closed or not (self.size > 0 and limiter.can_sample(n, self.size)):
                self._wait_for(
                    lambda: self.size > 0 and limiter.can_sample(n, self.size),
                    timeout,
                    "sample",
                    "sample_blocked_s",
                )
            return self._sample_locked(n)

    # ------------------------------------------------------ priorities, deletes
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set new priorities; keys of items no longer held are skipped and counted.

        Duplicate keys: the last priority given wins.

        Returns:
            How many items were updated.

        Raises:
            InvalidArgumentError: for keys not made by this table or invalid priorities.
        """
        with self.mutex:
            slots, prios = self._held(keys, priorities, "stale_updates")
            if len(slots):
                self._priority[slots] = prios
                self._max_priority = max(self._max_priority, float(prios.max()))
                self.sampler.update(slots, prios)
                self.remover.update(slots, prios)
            return len(slots)

    def delete(self, keys: Any) -> int:
        """Remove items; keys of items no longer held are skipped and counted.

        Returns:
            How many items were removed.

        Raises:
            InvalidArgumentError: for keys not made by this table.
        """
        with self.mutex:
            slots, _ = self._held(keys, None, "stale_deletes")
            if len(slots):
                self._remove_locked(slots)
                self._counts["deletes"] += len(slots)
                self._wake_waiters()
            return len(slots)

    # ----------------------------------------------------------- housekeeping
    def reset(self) -> None:
        """Remove every item and zero the rate limiter's counts (stored steps stay)."""
        with self.mutex:
            self._reset_locked()
            self._wake_waiters()

    def _reset_locked(self) -> None:
        self._deferred = None
        self._live.fill(False)
        self.sampler.clear()
        self.remover.clear()
        self.size = 0
        self._max_priority = 1.0
        self.rate_limiter.reset()

    def close(self) -> None:
        """Wake every blocked call with :class:`ClosedError` and refuse new blocking calls."""
        with self.mutex:
            self._closed = True
            self._wake_waiters()

    def info(self) -> TableInfo:
        """A snapshot of the table's counters and configuration."""
        with self.mutex:
            lim = self.rate_limiter
            return TableInfo(
                name=self.name,
                size=self.size,
                max_size=self.max_size,
                store_capacity=self.store.capacity,
                stored_steps=self.store.num_steps,
                sampler=repr(self.sampler),
                remover=repr(self.remover),
                rate_limiter=lim.config(),
                max_times_sampled=self.max_times_sampled,
                inserts=lim.inserts,
                samples=lim.samples,
                insert_blocked_s=lim.insert_blocked_s,
                sample_blocked_s=lim.sample_blocked_s,
                index_bytes=self.index_nbytes(),
                **self._counts,
            )

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return (
            f"Table({self.name!r}, size={self.size}/{self.max_size}, sampler={self.sampler!r}, "
            f"remover={self.remover!r}, {self.rate_limiter!r})"
        )
