"""Adding items to a table: rows stored with their items, and items over stored steps.

:meth:`TableInserts.insert` is the cpprb-style path: each row is appended to the store and
becomes its own item. :meth:`TableInserts.create_item` and :meth:`~TableInserts.create_items`
make items over steps a writer has already appended. :class:`TableInserts` is a part of
:class:`rlreplay.core.table.Table` and relies on the attributes ``Table.__init__`` sets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.table_checks import check_timeout
from rlreplay.errors import InvalidArgumentError, describe


class TableInserts:
    """The public calls that add items, and their argument checks."""

    def _is_one_row(self, rows: Any) -> bool:
        """Whether ``rows`` is one row without the batch axis (judged by its first field)."""
        probe_field = self._row_probe
        if probe_field is None or (type(rows) is not dict and not isinstance(rows, Mapping)):
            return False
        probe = rows.get(probe_field[0])
        if probe is None:
            return False
        ndim = probe.ndim if type(probe) is np.ndarray else np.ndim(probe)
        return ndim == probe_field[1]

    def _insert_one(self, row: Mapping, priorities: Any, timeout: float | None) -> np.ndarray:
        """:meth:`insert` of one row into a single-lane store, without arrays (the store
        validates the row, or writes it as is when it fits the columns)."""
        prio = None if priorities is None else float(check_priorities(priorities, 1)[0])
        if timeout is not None:
            timeout = check_timeout(timeout)
        limiter = self.rate_limiter
        limiter.check_insert_batch(1)
        store = self.store
        with self.mutex:
            if self._closed or not limiter.can_insert(1, self.size):
                row = store.signature.check_row(row, "rows")  # bad rows never wait
                self._wait_for(
                    lambda: limiter.can_insert(1, self.size), timeout, "insert", "insert_blocked_s"
                )
            first = store._write_row_locked(row)  # the common case, in fewer steps
            if first is None:
                slot = self._append_rows_locked(row, 1, timeout, one_row=True) % store.capacity
                key = self._insert_one_locked(slot, prio)
            else:
                slot = first % store.capacity
                in_place = first >= store.capacity and self._live_view[slot]
                key = self._insert_one_locked(slot, prio, in_place)
        keys = np.empty(1, dtype=np.int64)
        keys[0] = key
        return keys

    def _batch_length(self, rows: Any) -> int | None:
        """Rows in a batch the store may write as it is (judged by its first field, like
        :meth:`_is_one_row`); ``None`` when the batch must be validated first."""
        probe_field = self._row_probe
        if probe_field is None or not self.store._compiled_writes or type(rows) is not dict:
            return None
        probe = rows.get(probe_field[0])
        if type(probe) is not np.ndarray or probe.ndim != probe_field[1] + 1:
            return None
        return len(probe)

    def _priorities_or_default(self, priorities: Any, n: int) -> np.ndarray | None:
        if priorities is None:
            return None
        return check_priorities(priorities, n)

    def _check_lengths(self, lengths: Any, n: int) -> np.ndarray:
        """Per-item extents as int64 (``span`` when not given)."""
        span = self.layout.span
        if lengths is None:
            return np.full(n, span, dtype=np.int64)
        if self._extent is None:
            raise InvalidArgumentError(
                f"lengths were given but table {self.name!r} has a fixed-span layout; per-item "
                "lengths need from_end or pad windows"
            )
        arr = np.asarray(lengths)
        if arr.dtype.kind not in "iu" or arr.shape not in ((), (n,)):
            raise InvalidArgumentError(
                f"lengths={describe(lengths)} must be {n} ints (one per item) or one int"
            )
        arr = np.broadcast_to(arr.astype(np.int64), (n,))
        if n and (arr.min() < 1 or arr.max() > span):
            raise InvalidArgumentError(
                f"lengths={describe(arr.tolist())} must lie in [1, {span}] (the layout's span)"
            )
        return arr

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
            timeout: seconds to wait for the rate limiter; ``None`` waits without limit.

        Returns:
            int64 keys of the new items.

        Raises:
            InvalidArgumentError: if the table's layout is not rows (use a writer), or on
                bad rows or priorities; nothing is stored then.
            RateLimiterTimeoutError: if the limiter blocked the insert for ``timeout``.
        """
        if not self._is_rows:
            raise InvalidArgumentError(
                f"table {self.name!r} has items spanning {self.layout.span} steps; insert() "
                "stores one row per item, so append steps with a TrajectoryWriter instead"
            )
        store = self.store
        if self._is_one_row(rows):
            if store.lanes == 1:
                return self._insert_one(rows, priorities, timeout)
            one = store.signature.check_step(rows, "rows")
            arrays, n = {p: a[None] for p, a in one.items()}, 1
        else:
            # Rows that may fit the store as they are are checked while they are written.
            arrays, n = rows, self._batch_length(rows)
            if n is None:
                arrays, n = store.signature.check_batch(rows, "rows")
        if n < 1 or n > self.max_size or n % store.lanes:
            raise InvalidArgumentError(
                f"rows hold {n} rows; insert between 1 and max_size={self.max_size} at once"
                + (f", a multiple of lanes={store.lanes}" if store.lanes > 1 else "")
            )
        prios = self._priorities_or_default(priorities, n)
        timeout = check_timeout(timeout)
        limiter = self.rate_limiter
        limiter.check_insert_batch(n)
        with self.mutex:
            if self._closed or not limiter.can_insert(n, self.size):
                if arrays is rows:  # bad rows never wait
                    arrays, n = store.signature.check_batch(rows, "rows")
                self._wait_for(
                    lambda: limiter.can_insert(n, self.size), timeout, "insert", "insert_blocked_s"
                )
            first = self._append_rows_locked(arrays, n, timeout)
            start = first % store.capacity
            if start + n <= store.capacity:
                return self._insert_items_locked(np.arange(start, start + n), prios, start)
            slots = (np.arange(first, first + n)) % store.capacity
            return self._insert_items_locked(slots, prios)

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
        if length is not None or self._extent is not None:
            lengths = None if length is None else np.array([length])
            keys = self.create_items([anchor_id], priority, lengths=lengths, timeout=timeout)
            return int(keys[0])
        # One item of a fixed-span layout: the same checks in Python scalars.
        if priority is not None:
            if isinstance(priority, (int, float)) and 0 <= priority < math.inf:
                priority = float(priority)
            else:
                priority = float(check_priorities(priority, 1)[0])
        timeout = check_timeout(timeout)
        store = self.store
        anchor = int(anchor_id)
        with self.mutex:
            limiter = self.rate_limiter
            if self._closed or not limiter.can_insert(1, self.size):
                self._wait_for(
                    lambda: limiter.can_insert(1, self.size), timeout, "insert", "insert_blocked_s"
                )
            last = anchor + (self.layout.span - 1) * store.lanes
            if anchor < store.oldest_id or last >= store.next_id:
                raise InvalidArgumentError(
                    f"anchor id {anchor} with span {self.layout.span} reaches outside the "
                    f"stored steps [{store.oldest_id}, {store.next_id}); create items only over "
                    "steps already appended and not yet overwritten"
                )
            slot = anchor % store.capacity
            if self._live[slot]:
                raise InvalidArgumentError(
                    f"table {self.name!r} already holds an item anchored at step {anchor}; a "
                    "table holds at most one item per anchor step"
                )
            return self._insert_one_locked(slot, priority)

    def create_items(
        self,
        anchor_ids: np.ndarray,
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
        ids = np.asarray(anchor_ids, dtype=np.int64).reshape(-1)
        n = len(ids)
        if n > self.max_size:
            raise InvalidArgumentError(
                f"anchor_ids holds {n} anchors, more than max_size={self.max_size} of table "
                f"{self.name!r}; create at most max_size items at once"
            )
        prios = self._priorities_or_default(priorities, n)
        timeout = check_timeout(timeout)
        store = self.store
        extents = self._check_lengths(lengths, n)
        last_offset = (extents - 1) * store.lanes
        with self.mutex:
            self._wait_for(
                lambda: self.rate_limiter.can_insert(n, self.size),
                timeout,
                "insert",
                "insert_blocked_s",
            )
            if n == 0:
                return np.zeros(0, dtype=np.int64)
            if ids.min() < store.oldest_id or (ids + last_offset).max() >= store.next_id:
                raise InvalidArgumentError(
                    f"anchor ids {describe(ids.tolist())} with span {self.layout.span} reach "
                    f"outside the stored steps [{store.oldest_id}, {store.next_id}); create "
                    "items only over steps already appended and not yet overwritten"
                )
            slots = ids % store.capacity
            if self._live[slots].any() or len(np.unique(slots)) != n:
                raise InvalidArgumentError(
                    f"table {self.name!r} already holds an item anchored at one of steps "
                    f"{describe(ids.tolist())}; a table holds at most one item per anchor step"
                )
            keys = self._insert_items_locked(slots, prios)
            if self._extent is not None:
                self._extent[slots] = extents
            return keys
