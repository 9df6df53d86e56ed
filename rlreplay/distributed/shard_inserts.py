"""Where a sharded client's rows go: the shard each insert and each writer is placed on."""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from rlreplay.distributed.shard_deadline import Deadline, greet
from rlreplay.distributed.shard_health import ShardHealth
from rlreplay.distributed.shard_keys import ShardKeys
from rlreplay.distributed.sharded_table import ShardWriter
from rlreplay.errors import InvalidArgumentError, ServerUnavailableError, describe
from rlreplay.net.client.client import plain_int


class InsertRouter:
    """Places a sharded client's inserts and writers on its shards (threads may share it).

    Args:
        shards: one :class:`~rlreplay.Client` per shard.
        keys: the key translation of the sharded client.
        health: the shard-down policy and the shards taken for down.
        first_shard: the shard of this client's first writer and of ties between inserts.
    """

    def __init__(self, shards: list, keys: ShardKeys, health: ShardHealth, first_shard: int):
        self.shards = shards
        self.keys = keys
        self.health = health
        self.first_shard = first_shard
        self._sent_rows = np.zeros(len(shards), np.int64)
        self._writers = 0
        self._lock = threading.Lock()

    def next_shard(self, exclude: Collection[int] = ()) -> int:
        """The reachable shard (not in ``exclude``) the next insert goes to.

        Raises:
            ShardUnavailableError: if every shard is down.
            ServerUnavailableError: if every reachable shard is in ``exclude``.
        """
        live = [s for s in self.health.live() if s not in exclude]
        if not live:
            self.health.live()
            raise ServerUnavailableError("no replay shard took the insert")
        n = len(self.shards)
        with self._lock:
            return min(live, key=lambda s: (self._sent_rows[s], (s - self.first_shard) % n))

    def _sent(self, shard: int, rows: int) -> None:
        with self._lock:
            self._sent_rows[shard] += rows

    def insert(self, table: str, rows: Any, priorities: Any, deadline: Deadline) -> np.ndarray:
        """``rows`` inserted on :meth:`next_shard` within ``deadline`` (rerouted under ``"skip"``).

        Raises:
            as :meth:`Client.insert`; ShardUnavailableError for a shard down (``"fail"``).
        """
        tried: set[int] = set()
        timeout = deadline.timeout
        while True:
            shard = self.next_shard(tried)
            client = self.shards[shard]
            try:
                greet(self.shards, [shard], deadline, _raise)
                # before it issues a key
                self.keys.check_shard_tables(client, [table], deadline.bound)
                keys = client.insert(table, rows, priorities, timeout=timeout, until=deadline.until)
            except ServerUnavailableError as error:
                tried.add(shard)
                self.health.failed(shard, error)  # raises under "fail"
                deadline.grant_grace()
                continue
            self._sent(shard, len(keys))
            return self.keys.to_global(keys, shard)

    def trajectory_writer(
        self, tables: str | Sequence[str], shard: int | None, deadline: Deadline, **kwargs: Any
    ) -> ShardWriter:
        """A writer on ``shard``, or on the next shard in turn.

        Raises:
            InvalidArgumentError: for a ``shard`` this client does not have.
        """
        n = len(self.shards)
        if shard is None:
            with self._lock:
                shard = (self.first_shard + self._writers) % n
                self._writers += 1
        elif isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < n:
            raise InvalidArgumentError(f"shard={describe(shard)} must be an int in [0, {n})")
        client = self.shards[shard]
        names = [tables] if isinstance(tables, str) else tables
        self.keys.check_shard_tables(client, names, deadline.bound)
        writer = client.trajectory_writer(tables, **kwargs)
        return ShardWriter(writer, shard, self.keys, self.health)

    def can_insert(self, table: str, num_inserts: int, deadline: Deadline) -> bool:
        """Whether the next insert's shard would take ``num_inserts`` now.

        Raises:
            ShardUnavailableError: for a shard down (``"fail"``), or every shard down.
        """
        header = {"op": "can_insert", "table": table, "n": plain_int(num_inserts)}
        while True:
            shard = self.next_shard()
            try:
                greet(self.shards, [shard], deadline, _raise)
                reply = self.shards[shard].transport.call(header, until=deadline.bound)
            except ServerUnavailableError as error:
                self.health.failed(shard, error)  # raises under "fail"
                deadline.grant_grace()
                continue
            self.health.answered(shard)
            return bool(reply[0]["result"])


def _raise(shard: int, error: ServerUnavailableError) -> None:
    """Note a shard that did not answer an insert's handshake (under the policy)."""
    raise error
