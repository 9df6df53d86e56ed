"""Adding items to a table: rows stored with their items, and items over stored steps.

:func:`insert` is the cpprb-style path: each row is appended to the store and becomes its
own item. :func:`create_items` makes items over steps a writer has already appended.
:class:`~rlreplay.core.table.Table` calls these with its lock held; they use the table's
parts (its :class:`~rlreplay.core.item_slots.ItemIndex`, rate limiter and the store's
:class:`~rlreplay.core.overwrite.OverwriteProtocol`) through their methods.

Every call validates all its arguments before it waits or changes anything. One call
waits at most ``timeout`` seconds in total, for the rate limiter and the store together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.spec_checks import SEPARATOR
from rlreplay.core.table_checks import check_timeout
from rlreplay.core.waiting import BlockedCall
from rlreplay.errors import InvalidArgumentError, SignatureError, describe

if TYPE_CHECKING:
    from rlreplay.core.table import Table


def is_one_row(table: Table, rows: Any) -> bool:
    """Whether ``rows`` is one row without the batch axis (judged by its first field)."""
    probe_field = table._row_probe
    if probe_field is None or (type(rows) is not dict and not isinstance(rows, Mapping)):
        return False
    probe = field_value(rows, probe_field[0])
    if probe is None:
        return False
    ndim = probe.ndim if type(probe) is np.ndarray else np.ndim(probe)
    return ndim == probe_field[1]


def field_value(rows: Mapping[str, Any], path: str) -> Any:
    """The value of the field at ``path`` in ``rows``, given by its path (``"obs/pos"``)
    or nested (``rows["obs"]["pos"]``); ``None`` when it is not there."""
    value = rows.get(path)
    if value is not None or SEPARATOR not in path:
        return value
    node: Any = rows
    for part in path.split(SEPARATOR):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def raise_not_a_mapping(table: Table, rows: Any) -> None:
    """Raise the error for ``insert(rows)`` given something other than a mapping (a tuple
    of arrays, one array), naming this table's fields.

    Raises:
        SignatureError: always.
    """
    fields = list(table.store.signature.fields)
    shown = ", ".join(f"{f!r}: ..." for f in fields[:4]) + (", ..." if len(fields) > 4 else "")
    raise SignatureError(
        f"insert takes rows as a mapping of field name -> array, e.g. {{{shown}}} for "
        f"table {table.name!r}; got {describe(rows)}"
    )


def batch_length(table: Table, rows: Any) -> int | None:
    """Rows in a batch the store may write as it is (judged by its first field, like
    :func:`is_one_row`); ``None`` when the batch must be validated first."""
    probe_field = table._row_probe
    if probe_field is None or type(rows) is not dict:
        return None
    probe = rows.get(probe_field[0])
    if type(probe) is not np.ndarray or probe.ndim != probe_field[1] + 1:
        return None
    return len(probe)


def _store_rows(
    table: Table,
    arrays: Mapping[str, Any],
    n: int,
    waiter: BlockedCall | None,
    timeout: float | None,
) -> tuple[int, BlockedCall | None]:
    """Admit ``n`` items through the rate limiter and free ``n`` rows in the store, waiting
    for either as needed (one deadline for both), then write the validated rows; returns
    the first id (the table's own items on those rows are left for the caller to replace,
    in this lock hold)."""
    store = table.store
    protocol = store.overwrite
    while True:
        waiter = table.admission.admit(n, waiter, timeout)
        if protocol.make_room(n, successor=table) is not None:
            return store.write_locked(arrays, n), waiter
        waiter = waiter or table.admission.blocked_call(timeout, "insert")
        if not waiter.wait():
            waiter.settle()
            raise store.timeout_error(n, timeout)


def insert_one(table: Table, row: Mapping, priorities: Any, timeout: float | None) -> np.ndarray:
    """:meth:`Table.insert` of one row into a single-lane store, without arrays: the
    store writes it as it is when it fits the columns and the table is alone on the
    store, else it is validated first."""
    prio = None if priorities is None else float(check_priorities(priorities, 1)[0])
    if timeout is not None:
        timeout = check_timeout(timeout)
    limiter = table.rate_limiter
    limiter.check_insert_batch(1)
    store = table.store
    index = table.index
    waiter = None
    checked = False
    with table.mutex:
        if table.closed or not limiter.can_insert(1, index.size):
            row = store.signature.check_row(row, "rows")  # bad rows never wait
            checked = True
            waiter = table.admission.admit(1, None, timeout)
        first = None
        if store.compiled_writes and store.overwrite.sole is table.store_ref:
            first = store.put_row(row)  # the common case, in fewer steps
        if first is None:
            if not checked:
                row = store.signature.check_row(row, "rows")
            arrays = {p: np.asarray(v)[None] for p, v in row.items()}
            first, waiter = _store_rows(table, arrays, 1, waiter, timeout)
        if waiter is not None:
            waiter.settle()
        key = index.claim_one(first % store.capacity, prio)
        limiter.inserts += 1
        store.wake_waiters()
    keys = np.empty(1, dtype=np.int64)
    keys[0] = key
    return keys


def insert(table: Table, rows: Mapping[str, Any], priorities: Any, timeout: float | None):
    """:meth:`Table.insert` (see there)."""
    if not table._is_rows:
        raise InvalidArgumentError(
            f"table {table.name!r} has items spanning {table.layout.span} steps; insert() "
            "stores one row per item, so append steps with a TrajectoryWriter instead"
        )
    store = table.store
    if is_one_row(table, rows):
        if store.lanes == 1:
            return insert_one(table, rows, priorities, timeout)
        one = store.signature.check_step(rows, "rows")
        arrays, n = {p: a[None] for p, a in one.items()}, 1
    else:
        if type(rows) is not dict and not isinstance(rows, Mapping):
            raise_not_a_mapping(table, rows)
        # Rows that may fit the store as they are are checked while they are written.
        arrays, n = rows, batch_length(table, rows)
        if n is None:
            arrays, n = store.signature.check_batch(rows, "rows")
    if n < 1 or n > table.max_size or n % store.lanes:
        raise InvalidArgumentError(
            f"rows hold {n} rows; insert between 1 and max_size={table.max_size} at once"
            + (f", a multiple of lanes={store.lanes}" if store.lanes > 1 else "")
        )
    prios = None if priorities is None else check_priorities(priorities, n)
    timeout = check_timeout(timeout)
    limiter = table.rate_limiter
    limiter.check_insert_batch(n)
    index = table.index
    with table.mutex:
        first = None
        fast = store.compiled_writes and store.overwrite.sole is table.store_ref
        if fast and not table.closed and limiter.can_insert(n, index.size):
            first = store.put_rows(arrays, n)  # alone on the store: no hand-over
        if first is None:
            if arrays is rows:  # validate before waiting or changing anything
                arrays, n = store.signature.check_batch(rows, "rows")
            first, waiter = _store_rows(table, arrays, n, None, timeout)
            if waiter is not None:
                waiter.settle()
        start = first % store.capacity
        if start + n <= store.capacity:
            keys = index.claim(np.arange(start, start + n), prios, start)
        else:
            keys = index.claim(np.arange(first, first + n) % store.capacity, prios)
        limiter.inserts += n
        store.wake_waiters()
    return keys


def check_lengths(table: Table, lengths: Any, n: int) -> np.ndarray:
    """Per-item extents as int64 (``span`` when not given).

    Raises:
        InvalidArgumentError: for lengths on a fixed-span layout or outside ``[1, span]``.
    """
    span = table.layout.span
    if lengths is None:
        return np.full(n, span, dtype=np.int64)
    if table.index.extent is None:
        raise InvalidArgumentError(
            f"lengths were given but table {table.name!r} has a fixed-span layout; per-item "
            "lengths need from_end or pad windows"
        )
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


def check_one_priority(priority: Any) -> float | None:
    """A single item's priority as a float (``None`` stays ``None``)."""
    if priority is None:
        return None
    if isinstance(priority, (int, float)) and 0 <= priority < math.inf:
        return float(priority)
    return float(check_priorities(priority, 1)[0])


def create_items(
    table: Table,
    anchor_ids: Any,
    priorities: Any,
    lengths: Any,
    timeout: float | None,
) -> np.ndarray:
    """:meth:`Table.create_items` (see there)."""
    try:
        ids = np.asarray(anchor_ids).reshape(-1)
    except (TypeError, ValueError):
        ids = np.zeros(0, dtype=object)
    if ids.dtype.kind not in "iu" and not (ids.dtype.kind == "f" and len(ids) == 0):
        raise InvalidArgumentError(
            f"anchor_ids={describe(anchor_ids)} must be ints (store step ids)"
        )
    ids = ids.astype(np.int64)
    n = len(ids)
    if n > table.max_size:
        raise InvalidArgumentError(
            f"anchor_ids holds {n} anchors, more than max_size={table.max_size} of table "
            f"{table.name!r}; create at most max_size items at once"
        )
    prios = None if priorities is None else check_priorities(priorities, n)
    timeout = check_timeout(timeout)
    store = table.store
    extents = check_lengths(table, lengths, n)
    last_offset = (extents - 1) * store.lanes
    index = table.index
    limiter = table.rate_limiter
    with table.mutex:
        waiter = table.admission.admit(n, None, timeout)
        if waiter is not None:
            waiter.settle()
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        if ids.min() < store.oldest_id or (ids + last_offset).max() >= store.next_id:
            raise InvalidArgumentError(
                f"anchor ids {describe(ids.tolist())} with span {table.layout.span} reach "
                f"outside the stored steps [{store.oldest_id}, {store.next_id}); create "
                "items only over steps already appended and not yet overwritten"
            )
        slots = ids % store.capacity
        if index.live[slots].any() or not _distinct(ids, slots, store.capacity):
            raise InvalidArgumentError(
                f"table {table.name!r} already holds an item anchored at one of steps "
                f"{describe(ids.tolist())}; a table holds at most one item per anchor step"
            )
        keys = index.claim(slots, prios)
        if index.extent is not None:
            index.extent[slots] = extents
        limiter.inserts += n
        store.wake_waiters()
        return keys


def _distinct(ids: np.ndarray, slots: np.ndarray, capacity: int) -> bool:
    """Whether step ids ``ids`` fall on distinct ``slots``: increasing ids spanning less than
    ``capacity`` do (what writers create, checked in one pass), others are counted."""
    if len(ids) < 2 or (ids[-1] - ids[0] < capacity and (ids[1:] > ids[:-1]).all()):
        return True
    return len(np.unique(slots)) == len(ids)


def create_one(table: Table, anchor_id: int, priority: Any, timeout: float | None) -> int:
    """:meth:`Table.create_item` of one item of a fixed-span layout, in Python scalars."""
    priority = check_one_priority(priority)
    timeout = check_timeout(timeout)
    store = table.store
    anchor = int(anchor_id)
    index = table.index
    limiter = table.rate_limiter
    with table.mutex:
        if table.closed or not limiter.can_insert(1, index.size):
            waiter = table.admission.admit(1, None, timeout)
            if waiter is not None:
                waiter.settle()
        last = anchor + (table.layout.span - 1) * store.lanes
        if anchor < store.oldest_id or last >= store.next_id:
            raise InvalidArgumentError(
                f"anchor id {anchor} with span {table.layout.span} reaches outside the "
                f"stored steps [{store.oldest_id}, {store.next_id}); create items only over "
                "steps already appended and not yet overwritten"
            )
        slot = anchor % store.capacity
        if index.live[slot]:
            raise InvalidArgumentError(
                f"table {table.name!r} already holds an item anchored at step {anchor}; a "
                "table holds at most one item per anchor step"
            )
        key = index.claim_one(slot, priority)
        limiter.inserts += 1
        store.wake_waiters()
        return key
