"""TensorFlow-free ``TrajectoryDataset`` and ``TimestepDataset``: iterables of numpy
``ReplaySample(info, data)`` streamed from a server with requests in flight
(:class:`rlreplay.net.client.iterator.SampleIterator`).

``dataset.batch(n)`` makes a dataset of batches (``[n, ...]`` arrays, ``info`` fields
``[n]``); ``as_numpy_iterator()`` iterates; ``as_iterator(output="torch"|"jax")`` converts
the arrays. Where a table's rate limiter only waits for ``min_size_to_sample`` (and items
are never used up), a batch is one request of ``n`` items; otherwise items are requested
one at a time (``max_in_flight_samples_per_worker`` in flight), as Reverb streams them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from rlreplay.errors import RateLimiterTimeoutError, describe
from rlreplay.reverb import _nest
from rlreplay.reverb.client import Client, reverb_errors, to_reverb_keys
from rlreplay.reverb.errors import InvalidArgumentError, is_int
from rlreplay.reverb.replay_sample import ReplaySample, SampleInfo
from rlreplay.reverb.specs import TensorSpec, as_numpy_dtype, shape_fits

__all__ = ["Dataset", "TimestepDataset", "TrajectoryDataset"]


def _check_count(name: str, value: Any, allow_unset: bool = True) -> int:
    if not is_int(value) or (value < 1 and not (allow_unset and value == -1)):
        raise InvalidArgumentError(
            f"{name}={describe(value)} must be an int >= 1" + (" or -1" if allow_unset else "")
        )
    return int(value)


def _converter(output: str) -> Any:
    if output == "numpy":
        return None
    if output not in ("torch", "jax"):
        raise InvalidArgumentError(f"output={output!r} must be 'numpy', 'torch' or 'jax'")
    from rlreplay.iterators import _converter as convert

    return convert(output, None, False)


class Dataset:
    """An iterable of ``ReplaySample``; see the module docstring."""

    def __init__(
        self,
        source: _Source,
        batch_size: int | None = None,
        drop_remainder: bool = False,
        limit: int = -1,
    ):
        self._source = source
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._limit = limit

    # ------------------------------------------------------------ tf.data's verbs
    def batch(self, batch_size: int, drop_remainder: bool = False, **_: Any) -> Dataset:
        """A dataset of batches of ``batch_size`` samples (arrays gain a leading axis).

        Raises:
            InvalidArgumentError: for a ``batch_size`` that is not an int >= 1, or a
                dataset already batched.
        """
        if self._batch_size is not None:
            raise InvalidArgumentError("this dataset is batched already; batch it once")
        return Dataset(
            self._source, _check_count("batch_size", batch_size, False), drop_remainder, self._limit
        )

    def take(self, count: int) -> Dataset:
        """The first ``count`` elements (-1: all)."""
        return Dataset(
            self._source, self._batch_size, self._drop_remainder, _check_count("count", count)
        )

    def prefetch(self, buffer_size: Any = None) -> Dataset:
        """This dataset (requests are in flight already)."""
        return self

    def as_numpy_iterator(self) -> Iterator[ReplaySample]:
        return self.as_iterator("numpy")

    def as_iterator(self, output: str = "numpy") -> Iterator[ReplaySample]:
        """Iterate, with arrays as ``output`` (``"numpy"``, ``"torch"`` or ``"jax"``)."""
        convert = _converter(output)
        for n, element in enumerate(self._elements(), 1):
            if convert is not None:
                element = ReplaySample(
                    SampleInfo(*[convert(np.asarray(x)) for x in element.info]),
                    _nest.map_structure(convert, element.data),
                )
            yield element
            if self._limit >= 0 and n >= self._limit:
                return

    def __iter__(self) -> Iterator[ReplaySample]:
        return self.as_iterator("numpy")

    def _elements(self) -> Iterator[ReplaySample]:
        if self._batch_size is None:
            return self._source.singles()
        return self._source.batches(self._batch_size, self._drop_remainder)


class _Source:
    """The sample stream of one table."""

    def __init__(
        self,
        server_address: str | Client,
        table: str,
        in_flight: int,
        timeout_ms: int,
        max_samples: int,
        dtypes: Any,
        shapes: Any,
        timesteps: bool,
    ):
        self.client = (
            server_address if isinstance(server_address, Client) else Client(server_address)
        )
        self.table = table
        self.meta = self.client._table(table)
        self.in_flight = _check_count("max_in_flight_samples_per_worker", in_flight, False)
        self.timeout = None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000.0
        self.max_samples = _check_count("max_samples", max_samples)
        self.timesteps = timesteps
        self.structure = dtypes
        self._unflattener: Any = None
        self.specs = None
        if dtypes is not None:
            flat_dtypes = _nest.flatten(dtypes)
            flat_shapes = _nest.flatten_up_to(dtypes, shapes) if shapes is not None else None
            self.specs = [
                TensorSpec(() if flat_shapes is None else flat_shapes[i], as_numpy_dtype(dt))
                for i, dt in enumerate(flat_dtypes)
            ]
            self._check_specs()

    def _check_specs(self) -> None:
        fmt = self.meta.format
        if not fmt.typed or self.specs is None:
            return
        if len(self.specs) != len(fmt.specs):
            raise InvalidArgumentError(
                f"dtypes has {len(self.specs)} leaves but table {self.table!r} has "
                f"{len(fmt.specs)} columns; give one dtype and shape per signature leaf"
            )
        for i, (want, have) in enumerate(zip(self.specs, fmt.specs)):
            shapes = [have.shape, (1, *have.shape)]
            if self.timesteps:
                shapes.append(have.shape[1:])
            if want.dtype != have.dtype or not any(shape_fits(s, want.shape) for s in shapes):
                raise InvalidArgumentError(
                    f"leaf {i} of dtypes/shapes is {want.dtype}{list(want.shape)} but table "
                    f"{self.table!r} holds {have.dtype}{list(have.shape)} there"
                )

    def _requests(self, n: int) -> Iterator[Any]:
        """rlreplay sample batches of ``n`` items, ``in_flight`` requests outstanding;
        ends at ``max_samples`` or at the first rate-limiter timeout."""
        rr = self.client.rlreplay_client
        left = self.max_samples
        with reverb_errors():
            it = rr.sample_iterator(
                self.table, n, in_flight=max(1, self.in_flight // n), timeout=self.timeout
            )
        try:
            with reverb_errors():  # around the loop: a context per batch costs microseconds
                while left != 0:
                    try:
                        batch = next(it)
                    except RateLimiterTimeoutError:
                        return
                    n_items = len(batch.info.keys)
                    if left > 0:
                        n_items = min(n_items, left)
                        left -= n_items
                    yield batch, n_items
        finally:
            it.close()

    def _chunk(self, batch_size: int) -> int:
        meta = self.meta
        if meta.batchable:
            return min(batch_size, meta.data["max_size"])
        return 1

    def _typed_columns(self, data: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [data[f] for f in self.meta.format.fields]

    def _info(self, info: Any, lo: int = 0, hi: int | None = None) -> SampleInfo:
        """Reverb's batched info of items ``lo:hi`` of a sample (few numpy calls: each
        costs microseconds with the caches cold, as they are between learner steps)."""
        keys, probabilities = info.keys, info.probabilities
        priorities, times_sampled = info.priorities, info.times_sampled
        if lo or (hi is not None and hi < len(keys)):
            keys, probabilities = keys[lo:hi], probabilities[lo:hi]
            priorities, times_sampled = priorities[lo:hi], times_sampled[lo:hi]
        table_size = np.empty(len(keys), np.int64)
        table_size.fill(info.table_size)
        return SampleInfo(
            to_reverb_keys(keys),
            probabilities.astype(np.float64, copy=False),
            table_size,
            priorities.astype(np.float64, copy=False),
            times_sampled.astype(np.int32),
        )

    def _unflatten(self, flat: list[Any]) -> Any:
        if self.structure is None:
            return flat
        if self._unflattener is None:
            self._unflattener = _nest.unflattener(self.structure)
        return self._unflattener(flat)

    # -------------------------------------------------------------- trajectories
    def items(self, chunk: int) -> Iterator[tuple[SampleInfo, list[np.ndarray]]]:
        """(batched info, batched flat columns) of each request."""
        fmt = self.meta.format
        if self.max_samples > 0:
            chunk = min(chunk, self.max_samples)
        for batch, n in self._requests(chunk):
            if self.timesteps:
                yield from self._timestep_batches(batch, n)
                continue
            if fmt.typed:
                cols = self._typed_columns(batch.data)
                if n < len(batch.info.keys):
                    cols = [c[:n] for c in cols]
            else:
                items = fmt.decode(batch.data)[:n]
                for columns in items:
                    self._check_item(columns, columns)
                try:
                    cols = [np.stack(parts) for parts in zip(*items)]
                except ValueError:
                    raise InvalidArgumentError(
                        f"the items of table {self.table!r} in one batch differ in shape "
                        f"({[[c.shape for c in it] for it in items[:4]]}...); batch items of "
                        "one shape (give dtypes and shapes to have each item checked)"
                    ) from None
            yield self._info(batch.info, 0, n), cols

    def _timestep_batches(
        self, batch: Any, n: int
    ) -> Iterator[tuple[SampleInfo, list[np.ndarray]]]:
        items = self.meta.format.decode(batch.data)[:n]
        for i, columns in enumerate(items):
            info = self._info(batch.info, i, i + 1)
            if self._one_timestep(columns):
                self._check_item(columns, columns)
                yield info, [c[None] for c in columns]
                continue
            self._check_item(columns, [c[0] for c in columns])
            for t in range(len(columns[0])):
                yield info, [c[t : t + 1] for c in columns]

    def _check_item(self, columns: list[np.ndarray], timestep: list[np.ndarray]) -> None:
        """Refuse a sampled item of a table without a signature (whose items the server
        does not check) that ``dtypes`` and ``shapes`` do not describe: ``timestep`` is
        the item itself, or for a timestep dataset its first timestep.

        Raises:
            InvalidArgumentError: naming the leaf, what came and what was asked.
        """
        specs = self.specs
        if specs is None or self.meta.format.typed:
            return
        if len(specs) != len(columns):
            raise InvalidArgumentError(
                f"an item of table {self.table!r} has {len(columns)} columns but dtypes has "
                f"{len(specs)} leaves; give one dtype and shape per column"
            )
        for i, (have, want) in enumerate(zip(timestep, specs)):
            if have.dtype != want.dtype or not shape_fits(have.shape, want.shape):
                raise InvalidArgumentError(
                    f"an item of table {self.table!r} holds {have.dtype}{list(have.shape)} "
                    f"at leaf {i} but dtypes/shapes give {want.dtype}{list(want.shape)}"
                )

    def _one_timestep(self, columns: list[np.ndarray]) -> bool:
        """Whether an item is one timestep without a time axis (a trajectory writer's item
        of single cells): its columns have the shapes of a timestep, by ``dtypes`` and
        ``shapes`` where given; else its first axis is time (none: one timestep)."""
        if self.specs is not None and len(self.specs) == len(columns):
            return all(shape_fits(c.shape, s.shape) for c, s in zip(columns, self.specs))
        return any(c.ndim == 0 for c in columns)

    def singles(self) -> Iterator[ReplaySample]:
        for info, cols in self.items(self._chunk(max(1, min(self.in_flight, 64)))):
            for i in range(len(info.key)):
                yield ReplaySample(
                    SampleInfo(
                        int(info.key[i]),
                        float(info.probability[i]),
                        int(info.table_size[i]),
                        float(info.priority[i]),
                        int(info.times_sampled[i]),
                    ),
                    self._unflatten([c[i] for c in cols]),
                )

    def batches(self, batch_size: int, drop_remainder: bool) -> Iterator[ReplaySample]:
        chunk = self._chunk(batch_size)
        infos: list[SampleInfo] = []
        parts: list[list[np.ndarray]] = []
        held = 0
        for info, cols in self.items(chunk):
            if not infos and len(info.key) == batch_size:  # the common case: one request
                yield ReplaySample(info, self._unflatten(cols))
                continue
            infos.append(info)
            parts.append(cols)
            held += len(info.key)
            while held >= batch_size:
                yield self._take(infos, parts, batch_size)
                held -= batch_size
        if held and not drop_remainder:
            yield self._take(infos, parts, held)

    def _take(self, infos: list[SampleInfo], parts: list[list[np.ndarray]], n: int) -> ReplaySample:
        info = SampleInfo(*[np.concatenate(f) for f in zip(*infos)])
        cols = [np.concatenate(c) for c in zip(*parts)]
        rest_info = SampleInfo(*[f[n:] for f in info])
        infos.clear()
        parts.clear()
        if len(rest_info.key):
            infos.append(rest_info)
            parts.append([c[n:] for c in cols])
        return ReplaySample(
            SampleInfo(*[f[:n] for f in info]), self._unflatten([c[:n] for c in cols])
        )


def _signature_structure(client: Client, table: str, timeout: float | None) -> tuple[Any, Any]:
    client._tables(timeout)
    meta = client._table(table)
    if meta.signature is None:
        raise InvalidArgumentError(
            f"table {table!r} has no signature; give dtypes and shapes, or a signature to the table"
        )
    dtypes = _nest.map_structure(lambda s: s.dtype, meta.signature)
    shapes = _nest.map_structure(lambda s: tuple(s.shape), meta.signature)
    return dtypes, shapes


class TrajectoryDataset(Dataset):
    """Items of ``table`` as ``ReplaySample(info, data)`` with ``data`` nested as
    ``dtypes`` (shapes ``shapes``); see the module docstring.

    Args:
        server_address: the server's ``host:port`` (or a Client).
        table: the table's name.
        dtypes, shapes: nests (of one structure) of the items' columns' dtypes and shapes.
        max_in_flight_samples_per_worker: items requested ahead of the consumer.
        num_workers_per_iterator, max_samples_per_stream: accepted for Reverb's
            signature; rlreplay streams over one connection.
        rate_limiter_timeout_ms: a sample that waits this long ends the dataset (-1: wait).
        max_samples: the dataset ends after this many items (-1: never).

    Raises:
        InvalidArgumentError (a ValueError): for an unknown table, counts that are not
            positive, or dtypes/shapes that do not match the table's items.
    """

    _timesteps = False

    def __init__(
        self,
        server_address: str | Client,
        table: str,
        dtypes: Any,
        shapes: Any,
        max_in_flight_samples_per_worker: int = 100,
        num_workers_per_iterator: int = -1,
        max_samples_per_stream: int = -1,
        rate_limiter_timeout_ms: int = -1,
        max_samples: int = -1,
    ):
        _check_count("num_workers_per_iterator", num_workers_per_iterator)
        _check_count("max_samples_per_stream", max_samples_per_stream)
        super().__init__(
            _Source(
                server_address,
                table,
                max_in_flight_samples_per_worker,
                rate_limiter_timeout_ms,
                max_samples,
                dtypes,
                shapes,
                self._timesteps,
            )
        )

    @classmethod
    def from_table_signature(
        cls,
        server_address: str | Client,
        table: str,
        max_in_flight_samples_per_worker: int = 100,
        num_workers_per_iterator: int = -1,
        max_samples_per_stream: int = -1,
        rate_limiter_timeout_ms: int = -1,
        get_signature_timeout_secs: float | None = None,
        max_samples: int = -1,
    ) -> Any:
        """A dataset whose ``dtypes`` and ``shapes`` are the table's signature.

        Raises:
            InvalidArgumentError: if the table has no signature.
            DeadlineExceededError: if the server did not answer within
                ``get_signature_timeout_secs``.
        """
        client = server_address if isinstance(server_address, Client) else Client(server_address)
        dtypes, shapes = _signature_structure(client, table, get_signature_timeout_secs)
        return cls(
            client,
            table,
            dtypes,
            shapes,
            max_in_flight_samples_per_worker,
            num_workers_per_iterator,
            max_samples_per_stream,
            rate_limiter_timeout_ms,
            max_samples,
        )


class TimestepDataset(TrajectoryDataset):
    """As :class:`TrajectoryDataset`, one element per timestep of each item (items
    written as timesteps: ``Client.insert``, the legacy ``Writer``)."""

    _timesteps = True
