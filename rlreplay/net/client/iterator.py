"""A learner's sample stream that keeps several requests in flight and sends priority
updates with its next request."""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import numpy as np

from rlreplay.core.sample import Sample
from rlreplay.errors import ClosedError, InvalidArgumentError, check_count, check_timeout, describe
from rlreplay.iterators import batch_output
from rlreplay.net.client.transport import Sender
from rlreplay.net.wire.payloads import checked_update


class LearnerCalls(Protocol):
    """What a sample iterator needs of its client (a :class:`~rlreplay.Client`)."""

    transport: Sender

    def sample_async(
        self,
        table: str,
        batch_size: int,
        *,
        timeout: float | None = None,
        update: tuple[Any, Any] | None = None,
    ) -> int: ...

    def sample_result(self, rid: int, timeout: float | None = None) -> Sample: ...

    def update_priorities(
        self, table: str, keys: Any, priorities: Any, *, wait: bool = True
    ) -> int | None: ...


class SampleIterator:
    """Yields :class:`~rlreplay.Sample` batches of a served table with ``in_flight`` requests
    outstanding; priority updates travel with the next request, applied before it samples.
    Batches already in flight were sampled before later updates; with ``in_flight=1`` every
    batch sees all earlier updates.

    Args:
        client: the :class:`~rlreplay.Client`.
        table: the table's name.
        batch_size: items per batch.
        in_flight: requests kept outstanding (>= 1).
        timeout: seconds each request may wait for the rate limiter (``None``: no limit).
        output: ``"numpy"``, ``"torch"`` or ``"jax"`` (:func:`rlreplay.iterators.batch_output`).
        device: torch or jax device (``None``: the CPU, or jax's default).
        pin_memory: pin torch host memory before moving it to ``device``.

    Raises:
        InvalidArgumentError: for a bad argument.

    Raises (from ``next``):
        RateLimiterTimeoutError: when a request waited ``timeout`` s (its updates stay applied).
        InvalidArgumentError: when the server rejected the carried updates (none applied).
        ServerUnavailableError: when the server stops answering.

    Example:
        >>> with client.sample_iterator("replay", 256, in_flight=2) as it:  # doctest: +SKIP
        ...     for batch in it:
        ...         it.update_priorities(batch.info.keys, learn(batch))
    """

    def __init__(
        self,
        client: LearnerCalls,
        table: str,
        batch_size: int,
        *,
        in_flight: int = 4,
        timeout: float | None = None,
        output: str = "numpy",
        device: Any = None,
        pin_memory: bool = False,
    ):
        in_flight = check_count(in_flight, "in_flight")
        if not isinstance(table, str) or not table:
            raise InvalidArgumentError(f"table={describe(table)} must be a table's name (a str)")
        batch_size = check_count(batch_size, "batch_size")
        timeout = check_timeout(timeout)
        self._convert = batch_output(output, device, pin_memory)
        self.client, self.table, self.batch_size = client, table, batch_size
        self.in_flight, self.timeout = in_flight, timeout
        self._pending: deque[int] = deque()
        self._updates: list[tuple[np.ndarray, np.ndarray]] = []
        self._closed = False

    def update_priorities(self, keys: Any, priorities: Any) -> None:
        """Queue new priorities for the next sample request (for a repeated key the last wins).

        Raises:
            InvalidArgumentError: at once, for keys not 1-d integers or priorities not
                finite, >= 0 and one per key.
            ClosedError: after :meth:`close`.
        """
        if self._closed:
            raise ClosedError(
                "the sample iterator is closed; send priorities with "
                "client.update_priorities(table, keys, priorities)"
            )
        self._updates.append(checked_update(keys, priorities))

    def __iter__(self) -> SampleIterator:
        return self

    def __next__(self) -> Sample:
        if self._closed:
            raise StopIteration
        while len(self._pending) < self.in_flight:
            update = self._take()
            try:
                rid = self.client.sample_async(
                    self.table, self.batch_size, timeout=self.timeout, update=update
                )
            except BaseException:
                if update is not None:  # not sent: it goes with the next request
                    self._updates.insert(0, update)
                raise
            self._pending.append(rid)
        return self._convert(self.client.sample_result(self._pending.popleft(), self.timeout))

    def _take(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The queued updates as one, emptying the queue (None when there are none)."""
        if not self._updates:
            return None
        updates, self._updates = self._updates, []
        if len(updates) == 1:
            return updates[0]
        return np.concatenate([k for k, _ in updates]), np.concatenate([p for _, p in updates])

    def close(self, wait: bool = True) -> None:
        """Send the queued updates and cancel the outstanding requests. Call it from the
        iterating thread: from another, the requests are not cancelled and may still draw
        items (a queue's are then lost) until their lease ends. Batches already drawn for
        requests in flight are discarded: on a queue, use ``in_flight=1``.

        Args:
            wait: wait for the server to apply the updates (``False``: return at once; the
                server only logs errors). Leaving ``with`` on an exception does not wait.

        Raises:
            InvalidArgumentError: if the server rejected the queued updates (``wait``).
        """
        self._closed = True
        self.client.transport.cancel(self._pending)  # parked ones draw nothing
        self._pending.clear()
        update = self._take()
        if update is not None:
            self.client.update_priorities(self.table, *update, wait=wait)

    def __enter__(self) -> SampleIterator:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(wait=exc_type is None)
