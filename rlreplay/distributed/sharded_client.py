"""The sharded client: several replay servers behind the calls of one table."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlreplay.core.sample import Sample
from rlreplay.core.table_checks import seeded_rng
from rlreplay.core.table_info import TableInfo
from rlreplay.distributed.routed_calls import (
    described,
    each_shard,
    merged_info,
    routed_call,
    same_table,
)
from rlreplay.distributed.shard_checkpoints import checkpoint_shards
from rlreplay.distributed.shard_deadline import Deadline
from rlreplay.distributed.shard_health import ShardHealth
from rlreplay.distributed.shard_inserts import InsertRouter
from rlreplay.distributed.shard_keys import ShardKeys
from rlreplay.distributed.sharded_iterator import ShardedSampleIterator
from rlreplay.distributed.sharded_sampling import ShardedSampler
from rlreplay.distributed.sharded_table import ShardedTable, ShardWriter
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    check_count,
    check_timeout,
    describe,
)
from rlreplay.net.client.client import Client
from rlreplay.net.client.transport import CALL
from rlreplay.net.wire.payloads import checked_update


class ShardedClient:
    """Several replay servers (shards) serving the same tables, used as one.

    Has the calls of a :class:`~rlreplay.Client`: inserts and writers each go to one shard,
    ``sample`` draws over all shards exactly as one table holding every item would
    (:mod:`rlreplay.distributed.shard_draws`), and keys carry their shard
    (:mod:`rlreplay.distributed.shard_keys`). Every call is bounded as a
    :class:`~rlreplay.Client` call is, whatever shards are down. See docs/distributed.md.

    Args:
        addresses: one address per shard (``tcp://host:port``, ``host:port``, ``ipc://...``).
        on_shard_down: ``"fail"`` (default): a shard that does not answer raises
            :class:`~rlreplay.errors.ShardUnavailableError`; ``"skip"``: leave it out for
            ``retry_down_s`` seconds and use the reachable items.
        retry_down_s: see ``on_shard_down``.
        first_shard: the shard of the first writer and insert, modulo the number of shards;
            None: drawn at random per unpickled copy, so actors spread over the shards; with
            a ``seed`` every copy draws the same shard, so give actor ``i`` ``first_shard=i``.
        seed: seeds the batch splits and the drawn ``first_shard`` (None: fresh entropy).
        server_public_key: one CURVE key for every shard, or a list with one per shard.
        **client_kwargs: passed to each shard's :class:`~rlreplay.Client`.

    Raises:
        InvalidArgumentError: for no addresses, a repeated address, a bad policy or key list.

    Example:
        >>> client = ShardedClient([a.address, b.address])          # doctest: +SKIP
        >>> client.insert("replay", rows, priorities=1.0)            # doctest: +SKIP
        >>> batch = client.sample("replay", 256, timeout=5.0)        # doctest: +SKIP
        >>> client.update_priorities("replay", batch.info.keys, td)  # doctest: +SKIP
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        on_shard_down: str = "fail",
        retry_down_s: float = 5.0,
        first_shard: int | None = None,
        seed: int | None = None,
        server_public_key: Any = None,
        **client_kwargs: Any,
    ):
        if isinstance(addresses, str) or not isinstance(addresses, Sequence) or not addresses:
            raise InvalidArgumentError(
                f"addresses={describe(addresses)} must be a non-empty list of shard addresses"
            )
        n = len(addresses)
        keys = server_public_key
        if not isinstance(keys, (list, tuple)):
            keys = [keys] * n
        if len(keys) != n:
            raise InvalidArgumentError(
                f"server_public_key has {len(keys)} keys for {n} shards; give one per shard "
                "(or one for all)"
            )
        if first_shard is not None:
            first_shard = check_count(first_shard, "first_shard", "or None", minimum=0)
        self.shards = [
            Client(a, server_public_key=k, **client_kwargs) for a, k in zip(addresses, keys)
        ]
        self.addresses = [c.address for c in self.shards]
        if len(set(self.addresses)) != n:
            raise InvalidArgumentError(
                f"addresses={self.addresses} repeat a server; give each shard once"
            )
        self.health = ShardHealth(self.addresses, on_shard_down, retry_down_s)
        self._closed = False
        self.keys = ShardKeys(n)
        self._rng = seeded_rng(seed)
        # Unseeded, actors' unpickled clients spread their writers over the shards.
        first = int(self._rng.integers(n)) if first_shard is None else first_shard % n
        self.inserts = InsertRouter(self.shards, self.keys, self.health, first)
        self._init = {
            "addresses": list(addresses),
            "on_shard_down": on_shard_down,
            "retry_down_s": retry_down_s,
            "first_shard": first_shard,
            "seed": seed,
            "server_public_key": server_public_key,
            **client_kwargs,
        }
        self._samplers: dict[str, ShardedSampler] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return dict(self._init)

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        self.__init__(state.pop("addresses"), **state)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def first_shard(self) -> int:
        """The shard of this client's first writer (and of ties between inserts)."""
        return self.inserts.first_shard

    def close(self) -> None:
        """Close this process's sockets to every shard; later calls raise ClosedError."""
        self._closed = True
        for client in self.shards:
            client.close()

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardedClient({self.addresses!r})"

    def deadline(self, timeout: Any = CALL) -> Deadline:
        """The :class:`~rlreplay.distributed.shard_deadline.Deadline` of a call starting now.

        Raises:
            ClosedError: after :meth:`close`.
        """
        if self._closed:
            raise ClosedError(
                f"this ShardedClient of {self.addresses} was closed; create a new "
                "ShardedClient(addresses)"
            )
        return Deadline(self.shards[0].transport, timeout)

    def table(self, name: str) -> ShardedTable:
        """A handle with the calls of a local :class:`~rlreplay.Table`."""
        self.describe(name)
        return ShardedTable(self, name)

    def shard_of(self, keys: Any) -> np.ndarray:
        """The shard index of each key (from this client's samples or inserts)."""
        return self.keys.split(keys)[0]

    def describe(self, table: str) -> dict[str, Any]:
        """The description of ``table`` (as :meth:`Client.describe`) from the first reachable shard.

        Raises:
            InvalidArgumentError: if shards describe ``table`` differently.
        """
        return self._describe(table, self.deadline())

    def _describe(self, table: str, deadline: Deadline) -> dict[str, Any]:
        """:meth:`describe` within ``deadline``."""
        descriptions = described(self.shards, self.health, deadline, table)
        return same_table(table, descriptions, self.addresses, self.keys)

    def signature(self, table: str):
        from rlreplay.core.specs import Signature

        return Signature.from_json(self.describe(table)["signature"])

    def _each(self, header: dict, deadline: Deadline | None = None) -> dict[int, dict]:
        """Send ``header`` to every reachable shard within ``deadline``; reply headers by shard."""
        return each_shard(self.shards, self.health, deadline or self.deadline(), header)

    def insert(
        self, table: str, rows: Any, priorities: Any = None, *, timeout: float | None = None
    ) -> np.ndarray:
        """:meth:`Client.insert` on the reachable shard sent the fewest rows; returns the new keys.

        Raises:
            ShardUnavailableError: for a shard down (``"fail"``); else as :meth:`Client.insert`.
        """
        deadline = self.deadline(check_timeout(timeout))
        return self.inserts.insert(table, rows, priorities, deadline)

    def trajectory_writer(
        self, tables: str | Sequence[str], *, shard: int | None = None, **kwargs: Any
    ) -> ShardWriter:
        """A :class:`~rlreplay.RemoteTrajectoryWriter` on ``shard``, or the next in turn.

        Raises:
            InvalidArgumentError: for a ``shard`` this client does not have.
        """
        return self.inserts.trajectory_writer(tables, shard, self.deadline(), **kwargs)

    def sampler(self, table: str) -> ShardedSampler:
        """The :class:`ShardedSampler` of ``table`` (made on first use).

        Raises:
            InvalidArgumentError: for a ``table`` that is not a name.
        """
        with self._lock:
            sampler = self._samplers.get(table)
            if sampler is None:
                if not isinstance(table, str) or not table:
                    raise InvalidArgumentError(f"table={describe(table)} must be a table's name")
                sampler = ShardedSampler(table, self.shards, self.keys, self.health, self._rng)
                self._samplers[table] = sampler
            return sampler

    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout: float | None = None,
        update: tuple[Any, Any] | None = None,
    ) -> Sample:
        """A batch drawn over all shards as one table holding every item would draw it.

        Args:
            table: the table's name on every shard.
            batch_size: items to draw; at most the smallest shard's ``max_size``.
            timeout: seconds each shard's rate limiter may block its part (None: no limit).
            update: ``(keys, priorities)`` applied before sampling.

        Raises:
            InvalidArgumentError: for a bad batch size, timeout or update (other shards may have
                applied theirs), or differing samplers.
            RateLimiterTimeoutError: if a shard's part waited ``timeout`` seconds; the next call
                with the same ``batch_size`` completes the batch.
            ShardUnavailableError: for a shard down (``"fail"``), or every shard down.
        """
        deadline = self.deadline(check_timeout(timeout))
        batch_size = self.check_batch(table, batch_size, deadline)
        updates = self.route_update(update)
        return self.sampler(table).sample(batch_size, deadline, updates)

    def check_batch(self, table: str, batch_size: Any, deadline: Deadline | None = None) -> int:
        """Check ``batch_size`` against every shard's ``max_size`` (any shard may get it all).

        Raises:
            InvalidArgumentError: for a batch size that is not an int >= 1 or too large.
        """
        batch_size = check_count(batch_size, "batch_size")
        descriptions = described(self.shards, self.health, deadline or self.deadline(), table)
        largest = min(d["max_size"] for d in descriptions.values())
        if batch_size > largest:
            raise InvalidArgumentError(
                f"batch_size={batch_size} is above max_size={largest} of a shard of table "
                f"{table!r}; any shard may be asked for a whole batch (the split over "
                "shards is random), so give shards max_size >= batch_size"
            )
        return batch_size

    def route_update(self, update: Any) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
        """``(keys, priorities)`` checked and grouped by shard.

        Raises:
            InvalidArgumentError: for keys or priorities a table would refuse.
        """
        if update is None:
            return None
        if not isinstance(update, tuple) or len(update) != 2:
            raise InvalidArgumentError(
                f"update={describe(update)} must be a (keys, priorities) pair or None"
            )
        keys, priorities = checked_update(*update)
        return self.keys.group(keys, priorities)

    def sample_iterator(self, table: str, batch_size: int, **kwargs: Any):
        """A :class:`~rlreplay.distributed.ShardedSampleIterator` over ``table``."""
        return ShardedSampleIterator(self, table, batch_size, **kwargs)

    def update_priorities(
        self, table: str, keys: Any, priorities: Any, *, wait: bool = True
    ) -> int | None:
        """:meth:`Client.update_priorities`, each key's update sent to its shard, all at once.

        Returns:
            How many items were updated (None with ``wait=False``).

        Raises:
            InvalidArgumentError: for bad keys or priorities; names the shards that applied theirs.
            ShardUnavailableError: for a shard down (``"fail"``; others may have applied theirs).
        """
        groups = self.keys.group(*checked_update(keys, priorities))
        return routed_call(
            self.shards, self.health, "update_priorities", table, groups, wait, self.deadline()
        )

    def delete(self, table: str, keys: Any) -> int:
        """:meth:`Client.delete`, each key sent to its shard; how many items were removed.

        Raises:
            InvalidArgumentError: for bad keys; names the shards that removed theirs.
            ShardUnavailableError: for a shard down (``"fail"``; others may have removed theirs).
        """
        groups = self.keys.group(keys)
        return routed_call(self.shards, self.health, "delete", table, groups, True, self.deadline())

    def reset(self, table: str) -> None:
        """:meth:`Client.reset` on every reachable shard."""
        self._each({"op": "reset", "table": table})

    def checkpoint(self, timeout: float | None = None) -> dict[int, str]:
        """:meth:`Client.checkpoint` on every reachable shard; checkpoint directories by shard.

        Each checkpoint holds what its shard acknowledged before the request reached it.

        Args:
            timeout: seconds to wait for each shard (``None``: as long as it answers).

        Raises:
            InvalidArgumentError: for a bad ``timeout``, or a shard without a checkpoint directory.
            CheckpointError: if a shard's checkpoint could not be written.
            ReplayTimeoutError: if a shard did not publish within ``timeout``.
            ShardUnavailableError: for a shard down under ``"fail"`` (or all down).
        """
        deadline = self.deadline(check_timeout(timeout, none="wait until it is published"))
        return checkpoint_shards(self.shards, self.health, deadline)

    def shard_info(self, table: str) -> dict[int, TableInfo]:
        """Each reachable shard's :class:`TableInfo` of ``table``, by shard index."""
        replies = self._each({"op": "info", "table": table})
        return {shard: TableInfo.from_stats(r["tables"][table]) for shard, r in replies.items()}

    def server_info(self, table: str | None = None) -> dict[int, dict[str, dict]]:
        """Each reachable shard's :meth:`Client.server_info`, by shard index."""
        header = {"op": "info"} if table is None else {"op": "info", "table": table}
        return {shard: reply["tables"] for shard, reply in self._each(header).items()}

    def info(self, table: str) -> TableInfo:
        """``table``'s :class:`TableInfo` over the reachable shards (counts summed)."""
        return merged_info(list(self.shard_info(table).values()))

    def can_insert(self, table: str, num_inserts: int = 1) -> bool:
        """Whether the shard the next insert goes to would take ``num_inserts`` now."""
        return self.inserts.can_insert(table, num_inserts, self.deadline())

    def can_sample(self, table: str, num_samples: int = 1) -> bool:
        """Whether a sample of ``num_samples`` would be served now without waiting."""
        n = check_count(num_samples, "num_samples")
        return self.sampler(table).can_sample(n, self.deadline())
