"""Reverb's ``TrajectoryWriter``: steps appended column by column, items made of slices of
each column's recent history (``writer.history['obs'][-3:]``).

Each column keeps references to its last ``num_keep_alive_refs`` values; an item's
columns are stacked from them when it is created and sent as one row (see
:mod:`rlreplay.reverb._items`) through the client's pipelined inserts.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from rlreplay.errors import (
    RateLimiterTimeoutError,
    ReplayError,
    ReplayTimeoutError,
    describe,
)
from rlreplay.reverb import _nest, errors
from rlreplay.reverb._priorities import checked_priority
from rlreplay.reverb.errors import InvalidArgumentError, check_open, is_int
from rlreplay.reverb.specs import shape_text, tf_dtype_name

__all__ = ["TrajectoryColumn", "TrajectoryWriter"]


class CellRef:
    """A reference to one appended value (Reverb's ``WeakCellRef``)."""

    __slots__ = ("data",)

    def __init__(self, data: np.ndarray):
        self.data = data

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def expired(self) -> bool:
        return False

    def numpy(self) -> np.ndarray:
        return self.data

    def __repr__(self) -> str:
        return f"CellRef(shape={self.data.shape}, dtype={self.data.dtype})"


WeakCellRef = CellRef


class TrajectoryColumn:
    """References to values of one column, stacked into one array by :meth:`numpy`
    (``squeeze``: exactly one value, returned without the time axis).

    Raises:
        InvalidArgumentError (a ValueError): for ``squeeze`` with other than one reference,
            or a ``None`` reference (a value no longer, or never, held).
    """

    __slots__ = ("_refs", "is_squeezed")

    def __init__(
        self,
        data_references: Sequence[Any],
        *,
        squeeze: bool = False,
        path: tuple[Any, ...] | None = None,
    ):
        if squeeze and len(data_references) != 1:
            raise InvalidArgumentError(
                "Columns must contain exactly one data reference when squeeze set, got "
                f"{len(data_references)}"
            )
        if any(ref is None for ref in data_references):
            raise InvalidArgumentError(
                f"TrajectoryColumns cannot contain any None data references: "
                f"TrajectoryColumn at path {path} got {list(data_references)}; the history "
                "holds no value there (not yet appended, or older than num_keep_alive_refs)"
            )
        self._refs = tuple(data_references)
        self.is_squeezed = bool(squeeze)

    @classmethod
    def _of(cls, refs: tuple[Any, ...], squeeze: bool) -> TrajectoryColumn:
        """A column of checked references (no None), without the checks."""
        column = cls.__new__(cls)
        column._refs = refs
        column.is_squeezed = squeeze
        return column

    def __len__(self) -> int:
        return len(self._refs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._refs)

    def __getitem__(self, val: Any) -> TrajectoryColumn:
        if isinstance(val, (int, np.integer)):
            return TrajectoryColumn([self._refs[val]], squeeze=True)
        if isinstance(val, slice):
            return TrajectoryColumn(self._refs[val])
        if isinstance(val, list):
            return TrajectoryColumn([self._refs[i] for i in val])
        raise TypeError(f"TrajectoryColumn indices must be integers or slices, not {type(val)}")

    @property
    def shape(self) -> tuple[int, ...]:
        if self.is_squeezed:
            return tuple(self._refs[0].shape)
        return (len(self._refs), *self._refs[0].shape)

    @property
    def dtype(self) -> np.dtype:
        return self._refs[0].dtype

    def numpy(self) -> np.ndarray:
        """The referenced values stacked along a new first axis (or the one value).

        Raises:
            RuntimeError: if a reference has expired.
        """
        refs = self._refs
        if any(r.expired for r in refs):
            raise RuntimeError(
                "Cannot convert TrajectoryColumn with expired data references to numpy array."
            )
        if self.is_squeezed:
            return np.asarray(refs[0].numpy())
        if len(refs) == 1:
            return np.asarray(refs[0].numpy())[None]
        return np.stack([np.asarray(r.numpy()) for r in refs])


class _ColumnHistory:
    """The last ``buffer_size`` references of one column, indexed as if all were kept
    (older ones read as ``None``)."""

    def __init__(self, path: tuple[Any, ...], buffer_size: int, history_padding: int = 0):
        self._path = path
        self._buffer_size = buffer_size
        kept = min(buffer_size, history_padding)
        self._refs: list[Any] = [None] * kept
        self._offset = history_padding - kept

    def path(self) -> tuple[Any, ...]:
        return self._path

    def append(self, ref: Any) -> None:
        refs = self._refs
        refs.append(ref)
        if len(refs) > self._buffer_size:
            del refs[0]
            self._offset += 1

    def resize(self, buffer_size: int) -> None:
        self._buffer_size = buffer_size
        while len(self._refs) > buffer_size:
            del self._refs[0]
            self._offset += 1

    def reset(self) -> None:
        self._refs = []
        self._offset = 0

    def set_last(self, ref: Any) -> None:
        if not self._refs:
            raise RuntimeError("set_last called on empty history column")
        if self._refs[-1] is not None:
            raise RuntimeError("set_last called on already set cell")
        self._refs[-1] = ref

    @property
    def can_set_last(self) -> bool:
        return bool(self._refs) and self._refs[-1] is None

    def __len__(self) -> int:
        return len(self._refs) + self._offset

    def __iter__(self) -> Iterator[Any]:
        yield from [None] * self._offset
        yield from self._refs

    def _at(self, i: int) -> Any:
        n = len(self)
        if i < -n or i >= n:
            raise IndexError("list index out of range")
        i = i + n if i < 0 else i
        j = i - self._offset
        return self._refs[j] if j >= 0 else None

    def __getitem__(self, val: Any) -> TrajectoryColumn:
        if type(val) is int:
            refs, n = self._refs, len(self._refs)
            j = val - self._offset if val >= 0 else val + n
            if 0 <= j < n and val < n + self._offset:
                ref = refs[j]
                if ref is not None:
                    return TrajectoryColumn._of((ref,), True)
        path = (*self._path, val)
        if isinstance(val, (int, np.integer)):
            return TrajectoryColumn([self._at(int(val))], squeeze=True, path=path)
        if isinstance(val, slice):
            idx = range(len(self))[val]
            return TrajectoryColumn([self._at(i) for i in idx], path=path)
        if isinstance(val, list):
            return TrajectoryColumn([self._at(i) for i in val], path=path)
        raise TypeError(f"_ColumnHistory indices must be integers or slices, not {type(val)}")

    def __str__(self) -> str:
        return f"_ColumnHistory(path={self._path}, refs={self._refs})"


class TrajectoryWriter:
    """Writes items made of column slices to tables (made by
    :meth:`rlreplay.reverb.client.Client.trajectory_writer`).

    :meth:`create_item` does not wait for a rate limiter: items are held and sent in
    batches (at most ``SEND_EVERY`` items, or ``SEND_AFTER_S`` seconds after the first
    held one, on the next call), each offered to the server without waiting; those its
    rate limiter holds back stay held, in order, and are offered again with the next
    item. :meth:`flush` (or :meth:`end_episode`) sends them and waits until the server
    has them, which is where a rate limiter's wait is felt. More than ``MAX_HELD_BACK``
    held back for one table make :meth:`create_item` wait too.
    """

    SEND_EVERY = 64
    SEND_AFTER_S = 0.05
    MAX_HELD_BACK = 64  # batches (or single items) held back per table at most
    OFFER_S = 0.001  # how long an offer lets the rate limiter hold it before it is held back

    def __init__(self, client: Any, num_keep_alive_refs: int, *, validate_items: bool = True):
        self._held_back: dict[str, deque] = {}  # per table, what its limiter held back
        self._client = client
        self._keep = num_keep_alive_refs
        self._validate = validate_items
        self._columns: list[_ColumnHistory] = []
        self._specs: list[tuple[tuple[int, ...], np.dtype]] = []
        self._path_index: dict[tuple[Any, ...], int] = {}
        self._configs: dict[tuple[Any, ...], int] = {}
        self._structure: Any = None
        self._history: Any = None
        # append's fast path: a dict of leaves with the keys of the step before
        self._fast_keys: tuple[Any, ...] | None = None
        self._fast_plan: list[tuple[Any, _ColumnHistory, tuple[int, ...], np.dtype]] = []
        self._sorted_keys: dict[tuple[Any, ...], list[Any]] = {}
        self._pending: dict[str, Any] = {}
        self._metas: dict[str, Any] = {}
        self._first_pending = 0.0
        self._last_open = False
        self._episode_steps = 0
        self._closed = False

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if not self._closed and (exc_type is None or not issubclass(exc_type, errors.ReverbError)):
            self.flush()

    def __del__(self) -> None:
        # A writer dropped without close() is closed, as Reverb's is: its held items are
        # offered once, never waited for (a collection may run in any thread, the learner's
        # included, whose samples the rate limiter may be waiting for).
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._send()
            for table, queue in self._held_back.items():
                self._drain(table, queue, self.OFFER_S, offer=True)
        except Exception as exc:  # (at interpreter exit, say: the client is gone)
            logging.getLogger("rlreplay").warning(
                "a TrajectoryWriter dropped without close() could not send its items: %s", exc
            )
            return
        dropped = self._held_items()
        if dropped:
            logging.getLogger("rlreplay").warning(
                "a TrajectoryWriter dropped without close() dropped %d item(s) a rate limiter "
                "held back (close() waits for them)",
                dropped,
            )

    @property
    def history(self) -> Any:
        """Each column's history, nested as the appended data.

        Raises:
            RuntimeError: before the first :meth:`append`.
        """
        if not self._columns:
            raise RuntimeError(
                "history cannot be accessed before `append` is called at least once."
            )
        if self._history is None:
            self._history = _nest.map_structure(lambda i: self._columns[i], self._structure)
        return self._history

    @property
    def episode_steps(self) -> int:
        """Steps appended since the last :meth:`end_episode` (partial steps not counted)."""
        return self._episode_steps

    @property
    def max_num_keep_alive_refs(self) -> int:
        return max([self._keep, *self._configs.values()])

    def configure(
        self, path: tuple[Any, ...], *, num_keep_alive_refs: int, max_chunk_length: int | None
    ) -> None:
        """Keep ``num_keep_alive_refs`` values of the column at ``path`` (chunking is
        checked as Reverb does, and otherwise has no effect here).

        Raises:
            InvalidArgumentError (a ValueError): as Reverb.
        """
        if num_keep_alive_refs < 1:
            raise InvalidArgumentError(
                f"num_keep_alive_refs ({describe(num_keep_alive_refs)}) must be a positive integer"
            )
        if max_chunk_length is not None and not 1 <= max_chunk_length <= num_keep_alive_refs:
            raise InvalidArgumentError(
                f"max_chunk_length ({describe(max_chunk_length)}) must be None or a positive "
                f"integer <= num_keep_alive_refs ({describe(num_keep_alive_refs)})"
            )
        self._configs[path] = num_keep_alive_refs
        if path in self._path_index:
            self._columns[self._path_index[path]].resize(num_keep_alive_refs)

    # ------------------------------------------------------------ appending
    def _column(self, path: tuple[Any, ...], value: np.ndarray) -> int:
        index = len(self._columns)
        self._path_index[path] = index
        # Earlier steps (the open one included) read None in the new column.
        padding = len(self._columns[0]) if self._columns else 0
        self._columns.append(_ColumnHistory(path, self._configs.get(path, self._keep), padding))
        self._specs.append((value.shape, value.dtype))
        self._structure = self._history = self._fast_keys = None
        return index

    def _checked(self, index: int, path: tuple[Any, ...], value: Any) -> np.ndarray:
        # A copy, as Reverb's append copies: the caller may reuse its arrays.
        arr = value.copy() if type(value) is np.ndarray else np.array(value)
        shape, dtype = self._specs[index]
        if arr.dtype != dtype:
            raise InvalidArgumentError(
                f"Tensor of wrong dtype provided for column {path}. Got "
                f"{tf_dtype_name(arr.dtype)} but expected {tf_dtype_name(dtype)}."
            )
        if arr.shape != shape:
            raise InvalidArgumentError(
                f"Tensor of incompatible shape provided for column {path}. Got "
                f"{shape_text(arr.shape)} which is incompatible with {shape_text(shape)}."
            )
        return arr

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        """Append one step (a nest); new fields add columns (earlier steps read ``None``).

        Raises:
            InvalidArgumentError (a ValueError): for a value whose dtype or shape differs
                from its column's first value (naming the column's path), or a field
                given twice in one (partial) step.
            ClosedError: after :meth:`close`.
        """
        check_open(self._closed, "Append")
        if (
            not partial_step
            and not self._last_open
            and type(data) is dict
            and self._fast_keys is not None
            and tuple(data) == self._fast_keys
        ):
            self._append_fast(data)
            return
        flat = _nest.flatten_with_path(data)
        values = []
        for path, value in flat:
            if value is None:
                continue
            index = self._path_index.get(path)
            if index is None:
                index = self._column(path, np.asarray(value))
            values.append((index, self._checked(index, path, value)))
        if self._structure is None:
            paths = [p for p, _ in flat]
            if paths == list(self._path_index) and all(v is not None for _, v in flat):
                self._structure = _nest.unflatten_as(data, list(range(len(paths))))
            else:
                self._structure = _nest_of_paths(list(self._path_index))
        if self._last_open:
            for i, _ in values:
                if not self._columns[i].can_set_last:
                    raise InvalidArgumentError(
                        f"Field {self._columns[i].path()} has already been set in the active "
                        "step by previous (partial) append call and thus must be omitted or "
                        "set to None"
                    )
            for i, arr in values:
                self._columns[i].set_last(CellRef(arr))
        else:
            refs: list[Any] = [None] * len(self._columns)
            for i, arr in values:
                refs[i] = CellRef(arr)
            for column, ref in zip(self._columns, refs):
                column.append(ref)
        self._last_open = partial_step
        if not partial_step:
            self._episode_steps += 1
            self._plan_fast(data, flat)

    def _plan_fast(self, data: Any, flat: list[tuple[tuple[Any, ...], Any]]) -> None:
        """Let the next steps skip flattening when this one was a flat dict of every column."""
        if (
            type(data) is dict
            and len(flat) == len(self._columns) == len(data)
            and all(len(p) == 1 and v is not None for p, v in flat)
        ):
            self._fast_keys = tuple(data)
            self._fast_plan = [
                (
                    key,
                    self._columns[self._path_index[(key,)]],
                    *self._specs[self._path_index[(key,)]],
                )
                for key in data
            ]
        else:
            self._fast_keys = None

    def _append_fast(self, data: dict) -> None:
        checked = []
        for key, column, shape, dtype in self._fast_plan:
            value = data[key]
            arr = value.copy() if type(value) is np.ndarray else np.array(value)
            if arr.shape != shape or (arr.dtype is not dtype and arr.dtype != dtype):
                arr = self._checked(self._path_index[(key,)], (key,), value)
            checked.append((column, arr))
        for column, arr in checked:
            column.append(CellRef(arr))
        self._episode_steps += 1

    # ------------------------------------------------------------ items
    def create_item(self, table: str, priority: float, trajectory: Any) -> None:
        """Send an item of ``trajectory`` (a nest of :class:`TrajectoryColumn`) to
        ``table`` with ``priority``; returns without waiting (see :meth:`flush`).

        Raises:
            TypeError: if a leaf of ``trajectory`` is not a TrajectoryColumn.
            InvalidArgumentError (a ValueError): for data the table refuses (its
                signature, or a serialized item's ``max_item_bytes``) or a priority that
                is not a finite number >= 0.
            ClosedError: after :meth:`close`.
        """
        check_open(self._closed, "CreateItem")
        columns: list[np.ndarray] | None = None
        if type(trajectory) is dict:
            keys = tuple(trajectory)
            order = self._sorted_keys.get(keys)
            if order is None:
                order = self._sorted_keys[keys] = sorted(keys) if _sortable(keys) else None
            if order is not None:
                columns = _squeezed_columns([trajectory[k] for k in order])
        if columns is None:  # a nest below the dict, other leaves, or another structure
            flat = _nest.flatten(trajectory)
            columns = _squeezed_columns(flat)
            if columns is None:
                columns = []
                for c in flat:
                    if not isinstance(c, TrajectoryColumn):
                        raise TypeError(
                            "All leaves of `trajectory` must be `TrajectoryColumn` but got "
                            f"{trajectory}"
                        )
                    columns.append(c.numpy())
        if not columns:
            raise TypeError(f"`trajectory` holds no TrajectoryColumn: {trajectory}")
        self._hold(table, columns, priority)

    def _hold(self, table: str, columns: list[np.ndarray], priority: float) -> None:
        """Check the item now; send it with others (see the class docstring)."""
        client = self._client
        meta = self._metas.get(table)
        if meta is None:
            meta = self._metas[table] = client._table(table)
        prio = checked_priority(priority, table)
        if meta.insert_batch <= 1:
            self._offer(table, (client._encode_item(table, columns, False), prio))
            return
        try:
            steps = meta.format.check(table, columns, False)
        except ReplayError as exc:
            raise errors.translate(exc) from exc
        held = self._pending.get(table)
        if held is None:
            held = self._pending[table] = _HeldItems(meta.format, meta.insert_batch)
            if len(self._pending) == 1:
                self._first_pending = time.monotonic()
        held.add(columns, prio, steps)
        if held.n >= meta.insert_batch or (
            time.monotonic() - self._first_pending > self.SEND_AFTER_S
        ):
            self._send()

    def _send(self) -> None:
        """Offer the held batches to the server (one insert per table)."""
        pending, self._pending = self._pending, {}
        for table, held in pending.items():
            self._offer(table, held)

    def _offer(self, table: str, entry: Any) -> None:
        """Insert ``entry`` (a batch, or one ``(row, priority)``) if the table's rate
        limiter takes it now, after what it held back before; else hold it back (waiting,
        once ``MAX_HELD_BACK`` are held back for the table)."""
        queue = self._held_back.get(table)
        if queue is None:
            queue = self._held_back[table] = deque()
        queue.append(entry)
        if len(queue) <= self.MAX_HELD_BACK:
            self._drain(table, queue, self.OFFER_S, offer=True)
        else:
            self._drain(table, queue, None)

    def _drain(
        self, table: str, queue: deque, timeout: float | None, offer: bool = False
    ) -> None:
        """Insert what ``queue`` holds, in order, each waiting at most ``timeout`` seconds
        for the rate limiter (None: no limit); what it does not take stays.

        Raises:
            RateLimiterTimeoutError: when the limiter held an entry back for ``timeout``
                (unless this is an ``offer``: then the entry just stays).
        """
        client = self._client
        while queue:
            entry = queue[0]
            try:
                if type(entry) is tuple:
                    client._insert_rows(table, entry[0], entry[1], timeout)
                elif entry.arrays is not None:
                    client._insert_rows(
                        table, entry.rows(), entry.priorities[: entry.n], timeout
                    )
                else:
                    client._insert_items(
                        table, entry.items, entry.priorities[: entry.n], entry.steps, timeout
                    )
            except RateLimiterTimeoutError:
                if offer:
                    return  # held back: offered again later
                raise
            queue.popleft()

    def _held_items(self) -> int:
        """Items the tables' rate limiters hold back (an entry is one item or a batch)."""
        return sum(1 if type(e) is tuple else e.n for q in self._held_back.values() for e in q)

    def _drain_all(self, timeout: float | None) -> None:
        """Send the held items and wait until the server has every one, at most
        ``timeout`` seconds in all (None: no limit).

        Raises:
            RateLimiterTimeoutError: if the rate limiters held items back that long (they
                stay held).
        """
        self._send()
        end = None if timeout is None else time.monotonic() + timeout
        for table, queue in self._held_back.items():
            left = None if end is None else end - time.monotonic()
            self._drain(table, queue, max(left, 1e-3) if left is not None else None)

    def flush(self, block_until_num_items: int = 0, timeout_ms: int | None = None) -> None:
        """Send the held items and wait until the server has the items created so far
        (all of them).

        Raises:
            InvalidArgumentError (a ValueError): if ``block_until_num_items < 0``.
            DeadlineExceededError: if ``timeout_ms`` passed first (the items a rate
                limiter held back stay held, and go in with a later call).
            ClosedError: after :meth:`close`.
        """
        check_open(self._closed, "Flush")
        if not is_int(block_until_num_items) or block_until_num_items < 0:
            raise InvalidArgumentError(
                f"block_until_num_items must be an int >= 0, got {describe(block_until_num_items)}"
            )
        if timeout_ms is not None and not is_int(timeout_ms):
            raise InvalidArgumentError(
                f"timeout_ms={describe(timeout_ms)} must be an int (milliseconds; None or < 0: "
                "no limit)"
            )
        timeout = None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000.0
        try:
            self._drain_all(timeout)
        except ReplayTimeoutError as exc:
            if timeout is None:
                raise
            raise errors.DeadlineExceededError(
                "Flush call did not complete within provided timeout of "
                f"{datetime.timedelta(milliseconds=timeout_ms or 0)}"
            ) from exc

    def end_episode(self, clear_buffers: bool = True, timeout_ms: int | None = None) -> None:
        """Flush, then start a new episode (clearing the history unless told not to)."""
        check_open(self._closed, "EndEpisode")
        try:
            self.flush(0, timeout_ms)
        finally:
            if clear_buffers:
                for column in self._columns:
                    column.reset()
            self._episode_steps = 0

    def close(self) -> None:
        """Send the held items and close the writer. Items a rate limiter holds back are
        waited for at most the client's ``call_timeout``; those it still holds back then
        are dropped, with a warning."""
        if self._closed:
            return
        self._closed = True
        try:
            self._drain_all(self._client.rlreplay_client.call_timeout)
        except RateLimiterTimeoutError as exc:
            held = self._held_items()
            logging.getLogger("rlreplay").warning(
                "closing a TrajectoryWriter dropped %d item(s) a rate limiter held back: %s",
                held,
                exc,
            )


class _HeldItems:
    """Checked items of one table waiting to be sent: for typed storage, written straight
    into the batch's arrays (one per column); else kept as lists."""

    __slots__ = ("arrays", "fields", "items", "n", "priorities", "steps")

    def __init__(self, fmt: Any, size: int):
        self.n = 0
        self.priorities = np.empty(size, np.float64)
        self.arrays: list[np.ndarray] | None = None
        self.items: list[list[np.ndarray]] = []
        self.steps: list[int] = []
        if fmt.typed:
            self.fields = fmt.fields
            self.arrays = [np.empty((size, *sh), dt) for sh, dt in zip(fmt.shapes, fmt.dtypes)]

    def add(self, columns: list[np.ndarray], priority: float, steps: int) -> None:
        n = self.n
        if self.arrays is not None:  # a writer's items have the signature's shapes (steps 0)
            for array, column in zip(self.arrays, columns):
                array[n] = column
        else:
            self.items.append(columns)
            self.steps.append(steps)
        self.priorities[n] = priority
        self.n = n + 1

    def rows(self) -> dict[str, np.ndarray]:
        n = self.n
        rows = {f: a[:n] for f, a in zip(self.fields, self.arrays)}  # type: ignore[arg-type]
        rows["steps"] = np.zeros(n, np.uint8)
        return rows


def _squeezed_columns(flat: list[Any]) -> list[np.ndarray] | None:
    """The arrays of ``flat`` when every leaf is a squeezed column of this writer's
    references (the common transition item), else ``None``."""
    out = []
    for c in flat:
        if type(c) is not TrajectoryColumn or not c.is_squeezed:
            return None
        ref = c._refs[0]
        if type(ref) is not CellRef:
            return None
        out.append(ref.data)
    return out



def _sortable(keys: tuple[Any, ...]) -> bool:
    return all(type(k) is str for k in keys)


def _nest_of_paths(paths: list[tuple[Any, ...]]) -> Any:
    """A nest of column indices rebuilt from the columns' paths (dicts for str keys,
    lists for int indices)."""
    root: dict[Any, Any] = {}
    for index, path in enumerate(paths):
        if not path:
            return index
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = index

    def build(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if node and all(isinstance(k, int) for k in node):
            return [build(node[k]) for k in sorted(node)]
        return {k: build(v) for k, v in node.items()}

    return build(root)
