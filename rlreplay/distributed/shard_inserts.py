"""Where a sharded client's rows go: the shard each insert and each writer is placed on.

A sharded client spreads its writes over the shards so that every shard fills at about
the same rate while a writer's steps stay together on one shard. :class:`InsertRouter`
owns what that placement needs (the rows this client sent each shard, the writers it
opened, the first shard) and the calls that write: ``insert`` and ``trajectory_writer``.
Sampling is in :mod:`rlreplay.distributed.sharded_sampling`.
"""

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

    An insert goes to the reachable shard this client has sent the fewest rows (ties
    broken in turn from ``first_shard``); writers go to the shards in turn from
    ``first_shard``. Keys that come back are the sharded client's (they carry the shard).

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
        """``rows`` inserted on :meth:`next_shard` (see :meth:`ShardedClient.insert`)
        within ``deadline``: rows a shard did not take go to another under ``"skip"``.

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
        """A writer on ``shard``, or on the next shard in turn from ``first_shard`` (its
        tables' descriptions fetched within ``deadline``).

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
        """Whether the shard the next insert goes to would take ``num_inserts`` now
        (asked within ``deadline``); a shard that does not answer is handled by the
        shard-down policy as an insert's is (under ``"skip"`` the next shard is asked).

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
    """A shard an insert was to go to did not answer its handshake: the insert's loop
    notes it down (under the policy) and goes on."""
    raise error
