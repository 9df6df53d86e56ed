"""Which shards a sharded client may use, and what it does when one does not answer."""

from __future__ import annotations

import threading
import time

from rlreplay.errors import InvalidArgumentError, ServerUnavailableError, ShardUnavailableError

POLICIES = ("fail", "skip")


class ShardHealth:
    """The shard-down policy and the shards currently taken for down.

    ``"fail"``: a silent shard makes the call raise
    :class:`~rlreplay.errors.ShardUnavailableError`; ``"skip"``: it is left out for
    ``retry_down_s`` seconds (with every shard down, it raises too).

    Args:
        addresses: the shards' addresses (for messages).
        on_shard_down: ``"fail"`` or ``"skip"``.
        retry_down_s: seconds a shard taken for down is left out (``"skip"``).

    Raises:
        InvalidArgumentError: for an unknown policy or a negative ``retry_down_s``.
    """

    def __init__(self, addresses: list[str], on_shard_down: str, retry_down_s: float):
        if on_shard_down not in POLICIES:
            raise InvalidArgumentError(
                f"on_shard_down={on_shard_down!r} is unknown; choose one of {POLICIES}"
            )
        if (
            isinstance(retry_down_s, bool)
            or not isinstance(retry_down_s, (int, float))
            or not retry_down_s >= 0
        ):
            raise InvalidArgumentError(f"retry_down_s={retry_down_s!r} must be seconds >= 0")
        self.addresses = addresses
        self.policy = on_shard_down
        self.retry_down_s = float(retry_down_s)
        self._down: dict[int, float] = {}  # shard -> time.monotonic() it may be tried again
        self._lock = threading.Lock()

    def live(self) -> list[int]:
        """Shards to use now: all but those taken for down less than ``retry_down_s`` ago.

        Raises:
            ShardUnavailableError: if every shard is down (and none may be retried yet).
        """
        now = time.monotonic()
        with self._lock:
            shards = [s for s in range(len(self.addresses)) if self._down.get(s, 0.0) <= now]
        if not shards:
            raise ShardUnavailableError(
                f"every replay shard is down ({self.addresses}); retried after "
                f"{self.retry_down_s}s",
                shard=min(self._down, key=self._down.get),
                address=self.addresses[0],
            )
        return shards

    def is_down(self, shard: int) -> bool:
        with self._lock:
            return self._down.get(shard, 0.0) > time.monotonic()

    def failed(self, shard: int, error: ServerUnavailableError) -> None:
        """Note that ``shard`` did not answer.

        Raises:
            ShardUnavailableError: under ``"fail"``; under ``"skip"`` the caller goes on.
        """
        if self.policy == "fail":
            raise self.unavailable(shard, error) from error
        with self._lock:
            self._down[shard] = time.monotonic() + self.retry_down_s

    def unavailable(self, shard: int, error: ServerUnavailableError) -> ShardUnavailableError:
        """``error`` of ``shard``'s server as the error naming the shard."""
        return ShardUnavailableError(
            f"replay shard {shard} at {self.addresses[shard]} is unavailable: {error}",
            error.reason,
            shard,
            self.addresses[shard],
        )

    def answered(self, shard: int) -> None:
        """Note that ``shard`` answered (it is up again)."""
        if self._down:
            with self._lock:
                self._down.pop(shard, None)
