"""A learner's sample stream that keeps several requests in flight."""

from __future__ import annotations

from collections import deque

from rlreplay.sample import Sample


class SampleIterator:
    """Yields :class:`~rlreplay.Sample` batches from a served table, with ``in_flight``
    requests outstanding so the network and the server work while the learner computes.

    Args:
        client: the :class:`~rlreplay.Client`.
        table: the table's name.
        batch_size: items per batch.
        in_flight: requests kept outstanding (>= 1).
        timeout: seconds each request may wait for the rate limiter (``None``: no limit).

    Raises (from ``next``):
        RateLimiterTimeoutError: when a request waited ``timeout`` seconds.
        ServerUnavailableError: when the server stops answering.

    Example:
        >>> for batch in client.sample_iterator("replay", 256, in_flight=4):  # doctest: +SKIP
        ...     learn(batch)
    """

    def __init__(
        self,
        client,
        table: str,
        batch_size: int,
        *,
        in_flight: int = 4,
        timeout: float | None = None,
    ):
        from rlreplay.errors import InvalidArgumentError, describe

        if not isinstance(in_flight, int) or in_flight < 1:
            raise InvalidArgumentError(f"in_flight={describe(in_flight)} must be an int >= 1")
        self.client, self.table, self.batch_size = client, table, batch_size
        self.in_flight, self.timeout = in_flight, timeout
        self._pending: deque[int] = deque()

    def __iter__(self) -> SampleIterator:
        return self

    def __next__(self) -> Sample:
        while len(self._pending) < self.in_flight:
            self._pending.append(
                self.client.sample_async(self.table, self.batch_size, timeout=self.timeout)
            )
        return self.client.sample_result(self._pending.popleft(), self.timeout)

    def close(self) -> None:
        """Forget the outstanding requests (their replies are dropped when they arrive)."""
        self.client._channel().forget(self._pending)
        self._pending.clear()

    def __enter__(self) -> SampleIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
