"""A learner's sample stream over shards, with several batches in flight."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Protocol

import numpy as np

from rlreplay.core.sample import Sample, SampleInfo
from rlreplay.distributed.shard_deadline import Deadline
from rlreplay.distributed.shard_keys import ShardKeys
from rlreplay.distributed.sharded_sampling import Round, ShardedSampler
from rlreplay.errors import (
    ClosedError,
    ReplayTimeoutError,
    ServerUnavailableError,
    check_count,
    check_timeout,
)
from rlreplay.iterators import batch_output
from rlreplay.net.wire.payloads import checked_update


class ShardedCalls(Protocol):
    """What a sharded sample iterator needs of its client."""

    keys: ShardKeys

    def deadline(self, timeout: Any) -> Deadline: ...

    def check_batch(self, table: str, batch_size: Any, deadline: Deadline | None = None) -> int: ...

    def sampler(self, table: str) -> ShardedSampler: ...

    def update_priorities(
        self, table: str, keys: Any, priorities: Any, *, wait: bool = True
    ) -> int | None: ...


class ShardedSampleIterator:
    """Yields batches drawn over all shards, ``in_flight`` batches outstanding.

    Later rounds are sent before this one's replies are awaited; priority updates ride on
    the next round's request to their shard.

    Args:
        client: the :class:`~rlreplay.ShardedClient`.
        table: the table's name.
        batch_size: items per batch.
        in_flight: requests kept outstanding (>= 1).
        timeout: seconds each shard's part may wait for its rate limiter (None: no limit).
        batches_per_request: batches each round draws at once (>= 1); each shard must admit
            ``k * batch_size``.
        output: ``"numpy"``, ``"torch"`` or ``"jax"``, as for a :class:`~rlreplay.ReplayIterator`.
        device: torch or jax device for the arrays (``None``: the CPU, or jax's default).
        pin_memory: pin torch host memory before moving it to ``device``.

    Raises (from ``next``): as :meth:`ShardedClient.sample`; a batch held back past
    ``timeout`` is completed by the next ``next``.

    Example:
        >>> with client.sample_iterator("replay", 256, in_flight=2) as it:  # doctest: +SKIP
        ...     for batch in it:
        ...         it.update_priorities(batch.info.keys, learn(batch))
    """

    def __init__(
        self, client: ShardedCalls, table: str, batch_size: int, *, in_flight: int = 2,
        timeout: float | None = None, batches_per_request: int = 1,
        output: str = "numpy", device: Any = None, pin_memory: bool = False,
    ):
        in_flight = check_count(in_flight, "in_flight")
        batches_per_request = check_count(batches_per_request, "batches_per_request")
        self._convert = batch_output(output, device, pin_memory)
        self.client = client
        self.table = table
        self.timeout = check_timeout(timeout)
        deadline = client.deadline(self.timeout)  # the shards' descriptions, once
        self.batch_size = client.check_batch(table, batch_size, deadline)
        self.batches_per_request = batches_per_request
        self._request_size = client.check_batch(
            table, batch_size * batches_per_request, deadline
        )
        self._ready: deque[Sample] = deque()
        self.in_flight = in_flight
        self._sampler = client.sampler(table)
        self._rounds: deque[Round] = deque()
        self._updates: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._closed = False

    def update_priorities(self, keys: Any, priorities: Any) -> None:
        """Queue new priorities; each shard's go with the next request to that shard.

        Raises:
            InvalidArgumentError: at once, for keys not of this client or bad priorities.
            ClosedError: after :meth:`close`.
        """
        if self._closed:
            raise ClosedError(
                "the sample iterator is closed; send priorities with "
                "client.update_priorities(table, keys, priorities)"
            )
        for shard, pair in self.client.keys.group(*checked_update(keys, priorities)).items():
            self._updates.setdefault(shard, []).append(pair)

    def _take(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        updates, self._updates = self._updates, {}
        return {
            s: (np.concatenate([k for k, _ in u]), np.concatenate([p for _, p in u]))
            for s, u in updates.items()
        }

    def __iter__(self) -> ShardedSampleIterator:
        return self

    def __next__(self) -> Sample:
        if self._closed:
            raise StopIteration
        if self._ready:
            return self._convert(self._ready.popleft())
        deadline = self.client.deadline(self.timeout)  # this call's, for every step
        while len(self._rounds) < self.in_flight:
            updates = self._take()
            try:
                self._rounds.append(self._sampler.send(self._request_size, deadline, updates))
            except BaseException:
                # Not sent to every shard: resent with the next requests (reapplying is harmless).
                for shard, pair in updates.items():
                    self._updates.setdefault(shard, []).insert(0, pair)
                raise
        rnd = self._rounds.popleft()
        try:
            sample = self._sampler.finish(rnd, deadline)
        except ReplayTimeoutError as error:
            if rnd.held and not isinstance(error, ServerUnavailableError):
                self._rounds.appendleft(rnd)  # the next call completes this batch
            raise
        if self.batches_per_request == 1:
            return self._convert(sample)
        self._ready.extend(slices(sample, self.batch_size))
        return self._convert(self._ready.popleft())

    def close(self, wait: bool = True) -> None:
        """Forget the batches in flight and send the queued updates.

        Args:
            wait: as :meth:`update_priorities` (a down shard: up to half ``call_timeout``,
                raising under ``"fail"``); ``False``, and leaving ``with`` on an exception:
                return at once (a down shard's updates are dropped with a warning).
        """
        self._closed = True
        self._ready.clear()
        while self._rounds:
            self._sampler.forget(self._rounds.popleft())
        for shard, (keys, prios) in self._take().items():
            ours = self.client.keys.to_global(keys, shard)
            try:
                if not (wait or self._sampler.ready(shard)):
                    raise ServerUnavailableError("down, or not connected without a handshake")
                self.client.update_priorities(self.table, ours, prios, wait=wait)
            except ServerUnavailableError as error:  # (under "fail": taken for down)
                if wait:
                    raise
                logging.getLogger("rlreplay").warning(
                    "closing a sample iterator dropped %d priority update(s) of shard %d: %s",
                    len(keys), shard, error,
                )

    def __enter__(self) -> ShardedSampleIterator:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(wait=exc_type is None)


def slices(sample: Sample, size: int) -> list[Sample]:
    """``sample`` cut into consecutive batches of ``size`` items (views)."""
    info = sample.info
    out = []
    for start in range(0, len(info.keys), size):
        part = slice(start, start + size)
        out.append(Sample(
            {k: v[part] for k, v in sample.data.items()},
            SampleInfo(info.keys[part], info.probabilities[part], info.priorities[part],
                       info.times_sampled[part], info.table_size, info.min_probability),
        ))
    return out
