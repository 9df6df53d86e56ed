"""Reverb's ``Client`` and legacy ``Writer`` over :class:`rlreplay.Client`.

A client is a cheap handle: it connects (per process, per thread) on first use and
pickles as its address, as Reverb's does.
"""

from __future__ import annotations

import json
import operator
import threading
from collections import deque
from collections.abc import Generator, Iterable, Mapping, Sized
from contextlib import contextmanager
from typing import Any

import numpy as np

from rlreplay.errors import ReplayError, ServerUnavailableError, describe
from rlreplay.reverb import _nest, errors, specs
from rlreplay.reverb._items import ItemFormat
from rlreplay.reverb._priorities import checked_priorities, checked_priority
from rlreplay.reverb.errors import InvalidArgumentError, check_open, is_int
from rlreplay.reverb.replay_sample import ReplaySample, SampleInfo
from rlreplay.reverb.reverb_types import META_TABLE, TableInfo, table_info

__all__ = ["Client", "Writer"]

_UNLIMITED = -1e300  # a min_diff below this: samples wait only for min_size_to_sample
MAX_CHUNK = 1024  # items one sample request of Client.sample takes, at most
MAX_INSERT_BATCH = 64  # items a TrajectoryWriter sends in one insert, at most


@contextmanager
def reverb_errors() -> Any:
    """Raise rlreplay's errors under Reverb's names (subclasses of both)."""
    try:
        yield
    except ReplayError as exc:
        new = errors.translate(exc)
        if new is exc:
            raise
        raise new from exc


def to_reverb_keys(keys: np.ndarray) -> np.ndarray:
    """rlreplay's int64 keys as Reverb's unsigned 64-bit keys (the same bits)."""
    return np.ascontiguousarray(keys, np.int64).view(np.uint64)


def to_rlreplay_keys(keys: Iterable[Any]) -> np.ndarray:
    """Reverb's unsigned keys back to rlreplay's int64 (the same bits).

    Raises:
        InvalidArgumentError: for keys that are not integers in [0, 2**64).
    """
    if isinstance(keys, Sized) and not isinstance(keys, np.ndarray):
        try:  # the common case: ints from info.key (operator.index refuses floats)
            return np.fromiter(map(operator.index, keys), np.uint64, len(keys)).view(np.int64)
        except (TypeError, ValueError, OverflowError):
            pass  # said below, or a numpy integer array given as a list
    try:
        arr = np.asarray(list(keys) if not isinstance(keys, np.ndarray) else keys)
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError
        out = np.asarray(arr, np.uint64) if arr.dtype.kind == "u" or arr.size == 0 else None
        if out is None:
            if (arr < 0).any():
                raise OverflowError
            out = arr.astype(np.uint64)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgumentError(
            f"keys={describe(keys)} must be item keys (ints in [0, 2**64)) from sample().info.key"
        ) from None
    return out.reshape(-1).view(np.int64)


class TableMeta:
    """What a client knows of one served table: its description and item format."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.name: str = data["name"]
        self.format = ItemFormat.from_json(data["format"])
        sig = data["signature"]
        self.signature = None if sig is None else specs.nest_from_json(sig)
        lim = data["rate_limiter"]
        # A sample of many items at once behaves as that many single samples when the
        # limiter only waits for min_size_to_sample and items are never used up.
        self.batchable = data["max_times_sampled"] == 0 and lim["min_diff"] <= _UNLIMITED
        # Items a writer may send in one insert: any number (up to max_size) where inserts
        # never wait; else few enough that the limiter admits them together well before
        # its bound (half its range), so the batch waits about as single items would.
        if lim["max_diff"] >= -_UNLIMITED:
            batch = data["max_size"]
        else:
            batch = int((lim["max_diff"] - lim["min_diff"]) / (2 * lim["samples_per_insert"]))
        self.insert_batch = max(1, min(batch, data["max_size"], MAX_INSERT_BATCH))


def _columns(flat: list[Any]) -> list[np.ndarray]:
    """The leaves as arrays of their own (copies: the caller may reuse its arrays)."""
    return [np.array(x) for x in flat]


class Client:
    """Client of a Reverb (``rlreplay.reverb``) server at ``server_address``.

    Args:
        server_address: ``host:port`` (``localhost:8000``) or a ``tcp://`` address.
        client_options: (rlreplay) further keyword arguments of :class:`rlreplay.Client`.

    Raises:
        InvalidArgumentError (a ValueError): for a malformed address.
    """

    def __init__(self, server_address: str, **client_options: Any):
        if not isinstance(server_address, str) or not server_address:
            raise InvalidArgumentError(
                f"server_address={describe(server_address)} must be 'host:port'"
            )
        self._server_address = server_address
        self._options = client_options
        self._rr_client: Any = None
        self._meta: dict[str, TableMeta] | None = None
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple:
        return self.__class__, (self._server_address,)

    def __repr__(self) -> str:
        return f"Client, server_address={self._server_address}"

    @property
    def server_address(self) -> str:
        return self._server_address

    # ------------------------------------------------------------ plumbing
    @property
    def rlreplay_client(self) -> Any:
        """The :class:`rlreplay.Client` underneath (made on first use)."""
        if self._rr_client is None:
            from rlreplay.net.client.client import Client as RRClient

            with self._lock:
                if self._rr_client is None:
                    self._rr_client = RRClient(self._server_address, **self._options)
        return self._rr_client

    def _tables(self, timeout: float | None = None) -> dict[str, TableMeta]:
        """The served tables' descriptions (read once from the server)."""
        if self._meta is None:
            with reverb_errors():
                batch = self.rlreplay_client.sample(META_TABLE, 1, timeout=timeout)
            data = json.loads(batch.data["json"][0].tobytes())
            self._meta = {name: TableMeta(d) for name, d in data.items()}
        return self._meta

    def _table(self, table: str) -> TableMeta:
        tables = self._tables()
        if table not in tables:
            raise InvalidArgumentError(
                f'Could not find table "{table}". The following tables exists: {", ".join(tables)}.'
            )
        return tables[table]

    def _encode_item(self, table: str, columns: list[np.ndarray], timestep: bool) -> dict:
        """One item as a row of ``table`` (checked against its signature)."""
        with reverb_errors():
            return self._table(table).format.encode(table, columns, timestep)

    def _insert_item(
        self, table: str, columns: list[np.ndarray], priority: float, timestep: bool
    ) -> None:
        """Insert one item; returns once the server has it."""
        priority = checked_priority(priority, table)
        self._insert_rows(table, self._encode_item(table, columns, timestep), priority)

    def _insert_items(
        self,
        table: str,
        items: list[list[np.ndarray]],
        priorities: list[float],
        steps: list[int],
        timeout: float | None = None,
    ) -> None:
        """Insert checked items (see ItemFormat.check) in one call (the rate limiter may
        hold them ``timeout`` seconds; None: no limit)."""
        fmt = self._table(table).format
        with reverb_errors():
            if fmt.typed:
                batch: dict[str, Any] = {
                    f: np.stack([it[i][0] if st else it[i] for it, st in zip(items, steps)])
                    for i, f in enumerate(fmt.fields)
                }
                batch["steps"] = np.asarray(steps, np.uint8)
            else:
                batch = {"blob": np.stack([fmt.serialize(table, it) for it in items])}
            self.rlreplay_client.insert(
                table, batch, np.asarray(priorities, np.float64), timeout=timeout
            )

    def _insert_rows(
        self, table: str, rows: dict[str, np.ndarray], priorities: Any, timeout: float | None = None
    ) -> None:
        """Insert rows already in the table's format in one call (the rate limiter may
        hold them ``timeout`` seconds; None: no limit)."""
        with reverb_errors():
            self.rlreplay_client.insert(table, rows, priorities, timeout=timeout)

    # ------------------------------------------------------------ inserts
    def insert(self, data: Any, priorities: Mapping[str, float]) -> None:
        """Insert ``data`` (a nest) as one item of one timestep into each table named in
        ``priorities`` (table name to priority), and wait until the server has them.

        Raises:
            InvalidArgumentError (a ValueError): if ``priorities`` is empty, names an
                unknown table, or the data does not match a table's signature.
        """
        if not isinstance(priorities, Mapping) or not priorities:
            raise InvalidArgumentError(
                f"priorities={describe(priorities)} must be a dict of table name to priority, "
                "with at least one item"
            )
        columns = [c[None] for c in _columns(_nest.flatten(data))]
        for table, priority in priorities.items():
            self._insert_item(table, columns, priority, True)

    def writer(
        self,
        max_sequence_length: int,
        delta_encoded: bool = False,
        chunk_length: int | None = None,
        max_in_flight_items: int | None = 25,
    ) -> Writer:
        """The legacy :class:`Writer`: items over the last ``max_sequence_length`` steps.

        ``delta_encoded`` and ``chunk_length`` are checked and otherwise ignored (rlreplay
        keeps steps uncompressed); ``max_in_flight_items`` likewise.

        Raises:
            InvalidArgumentError (a ValueError): as Reverb, for ``max_sequence_length < 1``,
                ``chunk_length`` outside ``[1, max_sequence_length]`` or
                ``max_in_flight_items < 1``.
        """
        if not is_int(max_sequence_length) or max_sequence_length < 1:
            raise InvalidArgumentError(
                f"max_sequence_length ({describe(max_sequence_length)}) must be a positive integer"
            )
        if chunk_length is None:
            chunk_length = min(10, max_sequence_length)
        if chunk_length < 1 or chunk_length > max_sequence_length:
            raise InvalidArgumentError(
                f"chunk_length ({describe(chunk_length)}) must be a positive integer le to "
                f"max_sequence_length ({describe(max_sequence_length)})"
            )
        if max_in_flight_items is not None and max_in_flight_items < 1:
            raise InvalidArgumentError(
                f"max_in_flight_items ({describe(max_in_flight_items)}) must be a positive integer"
            )
        return Writer(self, max_sequence_length)

    def trajectory_writer(self, num_keep_alive_refs: int, *, validate_items: bool = True) -> Any:
        """A :class:`~rlreplay.reverb.trajectory_writer.TrajectoryWriter` keeping the last
        ``num_keep_alive_refs`` steps of each column referable.

        Raises:
            InvalidArgumentError (a ValueError): if ``num_keep_alive_refs < 1``.
        """
        from rlreplay.reverb.trajectory_writer import TrajectoryWriter

        if not is_int(num_keep_alive_refs) or num_keep_alive_refs < 1:
            raise InvalidArgumentError(
                f"num_keep_alive_refs ({describe(num_keep_alive_refs)}) must be a positive integer"
            )
        return TrajectoryWriter(self, num_keep_alive_refs, validate_items=validate_items)

    # ------------------------------------------------------------ sampling
    def _sample_items(
        self, table: str, num_samples: int
    ) -> Generator[tuple[SampleInfo, list[np.ndarray]], None, None]:
        meta = self._table(table)
        rr, left = self.rlreplay_client, num_samples
        # Requests grow 1, 2, 4, ... items: a caller that stops early has drawn (and
        # counted in times_sampled) at most as many more items as it consumed.
        chunk = 1
        while left > 0:
            n = min(left, meta.data["max_size"], chunk) if meta.batchable else 1
            chunk = min(2 * chunk, MAX_CHUNK)
            with reverb_errors():
                batch = rr.sample(table, n)
            info = batch.info
            keys = to_reverb_keys(info.keys)
            items = meta.format.decode(batch.data)
            for i, columns in enumerate(items):
                yield (
                    SampleInfo(
                        key=int(keys[i]),
                        probability=float(info.probabilities[i]),
                        table_size=int(info.table_size),
                        priority=float(info.priorities[i]),
                        times_sampled=int(info.times_sampled[i]),
                    ),
                    columns,
                )
            left -= len(items)

    def sample(
        self,
        table: str,
        num_samples: int = 1,
        *,
        emit_timesteps: bool = True,
        unpack_as_table_signature: bool = False,
    ) -> Generator[list[ReplaySample] | ReplaySample, None, None]:
        """Yield ``num_samples`` items of ``table``, waiting for the rate limiter.

        With ``emit_timesteps`` (the default) each item comes as a list of
        :class:`ReplaySample`, one per timestep; else as one :class:`ReplaySample` whose
        ``data`` holds the item's columns. ``unpack_as_table_signature`` nests the
        columns as the table's signature (flat when it has none).

        Raises:
            ValueError: with ``emit_timesteps``, for an item whose columns differ in length.
            InvalidArgumentError (a ValueError): for an unknown table.
        """
        if not is_int(num_samples) or num_samples < 1:
            raise InvalidArgumentError(f"num_samples={describe(num_samples)} must be an int >= 1")
        signature = self._table(table).signature if unpack_as_table_signature else None

        def unflatten(flat: list[Any]) -> Any:
            return flat if signature is None else _nest.unflatten_as(signature, flat)

        for info, columns in self._sample_items(table, int(num_samples)):
            if not emit_timesteps:
                yield ReplaySample(info, unflatten(columns))
                continue
            lengths = {len(c) if c.ndim else -1 for c in columns}
            if len(lengths) != 1 or -1 in lengths:
                raise InvalidArgumentError(
                    "Can't split non timestep trajectory into timesteps; sample with "
                    "emit_timesteps=False"
                )
            yield [
                ReplaySample(info, unflatten([np.asarray(c[t]) for c in columns]))
                for t in range(len(columns[0]))
            ]

    # ------------------------------------------------------------ table calls
    def mutate_priorities(
        self,
        table: str,
        updates: Mapping[int, float] | None = None,
        deletes: Iterable[int] | None = None,
    ) -> None:
        """Set priorities (``updates``: key to priority), then delete ``deletes``; keys
        of items no longer held are ignored.

        Raises:
            InvalidArgumentError (a ValueError): for keys or priorities that are not valid.
        """
        self._table(table)  # an unknown table is named, with the served ones
        rr = self.rlreplay_client
        with reverb_errors():
            if updates:
                keys = to_rlreplay_keys(updates.keys())
                rr.update_priorities(table, keys, checked_priorities(updates.values(), table))
            if deletes is not None:
                keys = to_rlreplay_keys(list(deletes))
                if len(keys):
                    rr.delete(table, keys)

    def reset(self, table: str) -> None:
        """Remove every item of ``table`` and reset its rate limiter."""
        self._table(table)
        with reverb_errors():
            self.rlreplay_client.reset(table)

    def server_info(self, timeout: float | None = None) -> dict[str, TableInfo]:
        """Each table's :class:`~rlreplay.reverb.reverb_types.TableInfo`.

        Raises:
            DeadlineExceededError: if ``timeout`` seconds passed without an answer.
        """
        try:
            if timeout is None:
                rr = self.rlreplay_client
                tables = self._tables()
            else:
                from rlreplay.net.client.client import Client as RRClient

                rr = RRClient(
                    self._server_address,
                    call_timeout=float(timeout),
                    diagnose_timeout=0.0,
                    **self._options,
                )
                if self._meta is None:
                    batch = rr.sample(META_TABLE, 1, timeout=float(timeout))
                    data = json.loads(batch.data["json"][0].tobytes())
                    self._meta = {name: TableMeta(d) for name, d in data.items()}
                tables = self._meta
            with reverb_errors():
                stats = rr.server_info()
        except (ServerUnavailableError, errors.DeadlineExceededError) as exc:
            if timeout is None:
                raise
            raise errors.DeadlineExceededError(
                f"ServerInfo call did not complete within provided timeout of {timeout}s"
            ) from exc
        finally:
            if timeout is not None and "rr" in locals():
                rr.close()
        return {
            name: table_info(meta.data, stats.get(name, {}), meta.signature)
            for name, meta in tables.items()
        }

    def checkpoint(self) -> str:
        """Have the server save a checkpoint; returns its directory."""
        with reverb_errors():
            return self.rlreplay_client.checkpoint()


class Writer:
    """Reverb's legacy writer: keeps the last ``max_sequence_length`` appended steps and
    makes items of the most recent ``num_timesteps`` of them (made by
    :meth:`Client.writer`)."""

    def __init__(self, client: Client, max_sequence_length: int):
        self._client = client
        self._steps: deque[list[np.ndarray]] = deque(maxlen=max_sequence_length)
        self._closed = False

    def __enter__(self) -> Writer:
        if self._closed:
            raise InvalidArgumentError("Cannot reuse already closed Writer")
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed:
            self.close()

    def __del__(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"Writer(steps={len(self._steps)}), closed: {self._closed}"

    def append(self, data: Any) -> None:
        """Make one step (a nest) available to the next items.

        Raises:
            ClosedError: after :meth:`close`.
        """
        check_open(self._closed, "Append")
        self._steps.append(_columns(_nest.flatten(data)))

    def append_sequence(self, sequence: Any) -> None:
        """Append each step of ``sequence`` (a nest of arrays with a leading time axis).

        Raises:
            InvalidArgumentError (a ValueError): if the leaves differ in length.
            ClosedError: after :meth:`close`.
        """
        check_open(self._closed, "AppendSequence")
        columns = _columns(_nest.flatten(sequence))
        lengths = {len(c) for c in columns}
        if len(lengths) != 1:
            raise InvalidArgumentError(
                f"append_sequence: every leaf must have the same leading dimension, got "
                f"{sorted(lengths)}"
            )
        for t in range(lengths.pop()):
            self._steps.append([c[t] for c in columns])

    def create_item(self, table: str, num_timesteps: int, priority: float) -> None:
        """An item of the last ``num_timesteps`` steps into ``table``.

        Raises:
            InvalidArgumentError (a ValueError): for ``num_timesteps < 1`` or more than
                are held, steps of different structure, or data the table refuses.
            ClosedError: after :meth:`close`.
        """
        check_open(self._closed, "CreateItem")
        if not is_int(num_timesteps) or num_timesteps < 1:
            raise InvalidArgumentError(
                f"num_timesteps ({describe(num_timesteps)}) must be a positive integer"
            )
        if num_timesteps > len(self._steps):
            raise InvalidArgumentError(
                f"num_timesteps ({describe(num_timesteps)}) is more than the "
                f"{len(self._steps)} steps this writer holds (at most max_sequence_length); "
                "append more first"
            )
        steps = list(self._steps)[-num_timesteps:]
        width = {len(s) for s in steps}
        if len(width) != 1:
            raise InvalidArgumentError(
                "the steps of one item must have the same structure; got steps of "
                f"{sorted(width)} leaves"
            )
        try:
            columns = [np.stack(parts) for parts in zip(*steps)]
        except ValueError as exc:
            raise InvalidArgumentError(f"the steps of one item differ in shape: {exc}") from None
        self._client._insert_item(table, columns, priority, True)

    def flush(self) -> None:
        """Wait until the server has every item created so far (each item is inserted,
        and acknowledged, when it is created)."""

    def close(self, retry_on_unavailable: bool = True) -> None:
        """Send what is pending and close the writer.

        Raises:
            InvalidArgumentError (a ValueError): if it was closed already.
        """
        if self._closed:
            raise InvalidArgumentError("close() has already been called on Writer.")
        self._closed = True
