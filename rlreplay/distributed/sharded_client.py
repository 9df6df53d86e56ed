"""The sharded client: several replay servers behind the calls of one table.

See :class:`ShardedClient`. It owns the shards' clients and composes the parts that do
the work: where inserts and writers go (:mod:`rlreplay.distributed.shard_inserts`), how a
batch is drawn over shards (:mod:`rlreplay.distributed.sharded_sampling`, split as
:mod:`rlreplay.distributed.shard_draws` says), the keys
(:mod:`rlreplay.distributed.shard_keys`) and the shard-down policy
(:mod:`rlreplay.distributed.shard_health`).
"""

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

    Each shard is an ordinary :class:`~rlreplay.Server` holding part of the items. The
    client has the calls of a :class:`~rlreplay.Client`:

    * ``insert`` sends each call's rows to one shard (the one this client has sent the
      fewest rows), and :meth:`trajectory_writer` puts each writer on one shard (in turn,
      from ``first_shard``), so a writer's steps stay together.
    * ``sample`` draws from every shard at once, in proportion to each shard's size
      (uniform sampler) or priority mass (prioritized): the batch, its probabilities and
      its importance weights are those of one table holding every item (probabilities
      ``P(i) = p_i ** alpha / sum over all shards``, ``table_size`` the total). See
      :mod:`rlreplay.distributed.shard_draws` for the method and its one caveat.
    * Keys carry their shard (:mod:`rlreplay.distributed.shard_keys`):
      ``update_priorities`` and ``delete`` go to the shard owning each key.
    * :meth:`sample_iterator` keeps batches in flight with requests to all shards out at
      once and carries priority updates with them.

    Every call is bounded as a :class:`~rlreplay.Client` call is: by its own ``timeout``
    (plus the reply grace) where it has one, its parts that never block (handshakes,
    descriptions, state probes) by ``call_timeout`` when it has none, whatever shards are
    down: one :class:`~rlreplay.distributed.shard_deadline.Deadline` per call, from its
    start, bounds every step over every shard.

    Args:
        addresses: one address per shard (``tcp://host:port``, ``host:port``, ``ipc://...``).
        on_shard_down: ``"fail"`` (default): a shard that does not answer makes the call
            raise :class:`~rlreplay.errors.ShardUnavailableError`; ``"skip"``: leave it out
            for ``retry_down_s`` seconds and go on with the others (samples are then drawn
            over the reachable items, with probabilities over those).
        retry_down_s: see ``on_shard_down``.
        first_shard: the shard this client's first writer and insert use, taken modulo
            the number of shards (so actor ``i`` may pass ``i``); None: drawn at random,
            so that many actors' clients spread over the shards (each unpickled copy
            draws its own unless ``seed`` is given).
        seed: seeds the splits of batches over shards and the ``first_shard`` drawn
            (None: fresh entropy).
        server_public_key: one key for every shard, or a list with one per shard (CURVE).
        **client_kwargs: passed to each shard's :class:`~rlreplay.Client`
            (``client_secret_key``, ``call_timeout``, ``liveness_s``, ``diagnose_timeout``).

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
        # Clients of many actors (each unpickled) spread their writers over the shards.
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

    # ------------------------------------------------------------ handles
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
        """The :class:`~rlreplay.distributed.shard_deadline.Deadline` of a call with
        ``timeout`` starting now (``CALL``: a call that never blocks).

        Raises:
            ClosedError: after :meth:`close` (every call starts here).
        """
        if self._closed:
            raise ClosedError(
                f"this ShardedClient of {self.addresses} was closed; create a new "
                "ShardedClient(addresses)"
            )
        return Deadline(self.shards[0].transport, timeout)

    def table(self, name: str) -> ShardedTable:
        """A handle with the calls of a local :class:`~rlreplay.Table` (for the runtime's
        learner and for code written against a table)."""
        self.describe(name)
        return ShardedTable(self, name)

    def shard_of(self, keys: Any) -> np.ndarray:
        """The shard index of each key (from this client's samples or inserts)."""
        return self.keys.split(keys)[0]

    # ------------------------------------------------------------- describe
    def describe(self, table: str) -> dict[str, Any]:
        """The description of ``table`` (as :meth:`Client.describe`) from the first
        reachable shard.

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
        """The request ``header`` to every reachable shard within ``deadline`` (default: a
        call that never blocks, from now); reply headers by shard."""
        return each_shard(self.shards, self.health, deadline or self.deadline(), header)

    # --------------------------------------------------------------- inserts
    def insert(
        self, table: str, rows: Any, priorities: Any = None, *, timeout: float | None = None
    ) -> np.ndarray:
        """:meth:`Client.insert` on one shard, the reachable shard this client has sent
        the fewest rows; returns the new items' keys (this client's keys, which carry the
        shard). Under ``on_shard_down="skip"`` rows a shard did not take go to another
        (they were not applied there, and never will be).

        Raises:
            ShardUnavailableError: for a shard down (``"fail"``); otherwise as
                :meth:`Client.insert`.
        """
        deadline = self.deadline(check_timeout(timeout))
        return self.inserts.insert(table, rows, priorities, deadline)

    def trajectory_writer(
        self, tables: str | Sequence[str], *, shard: int | None = None, **kwargs: Any
    ) -> ShardWriter:
        """A :class:`~rlreplay.RemoteTrajectoryWriter` on one shard (its keys are this
        client's keys): ``shard``, or the next one in turn from ``first_shard``.

        Raises:
            InvalidArgumentError: for a ``shard`` this client does not have.
        """
        return self.inserts.trajectory_writer(tables, shard, self.deadline(), **kwargs)

    # -------------------------------------------------------------- sampling
    def sampler(self, table: str) -> ShardedSampler:
        """The :class:`ShardedSampler` of ``table`` (one per table, made on first use).

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
            batch_size: items to draw (at most the smallest shard's ``max_size``, and each
                shard's rate limiter must admit a whole batch at once).
            timeout: seconds each shard's rate limiter may block its part (None: no limit).
            update: ``(keys, priorities)`` applied before sampling, each key's update
                carried by the request to its shard.

        Raises:
            InvalidArgumentError: for a bad batch size (see above), timeout or update, or
                shards whose samplers are not both Uniform or both Prioritized alike
                (checked before anything is sent), or an update key its shard never
                issued: that shard changes nothing, but the other shards may have applied
                their updates and drawn their parts (dropped; see docs/distributed.md).
            RateLimiterTimeoutError: if a shard's part waited ``timeout`` seconds; the
                other shards' parts are kept and the next call with the same
                ``batch_size`` completes the batch (see :meth:`ShardedSampler.finish`).
            ShardUnavailableError: for a shard down (``"fail"``; the other shards' parts
                were drawn and are dropped), or every shard down.
        """
        deadline = self.deadline(check_timeout(timeout))
        batch_size = self.check_batch(table, batch_size, deadline)
        updates = self.route_update(update)
        return self.sampler(table).sample(batch_size, deadline, updates)

    def check_batch(self, table: str, batch_size: Any, deadline: Deadline | None = None) -> int:
        """``batch_size`` checked against every shard: any shard may be asked for the
        whole batch (the split is random), so it must fit each shard's ``max_size``.

        Raises:
            InvalidArgumentError: for a batch size that is not an int >= 1, or above the
                smallest shard's ``max_size``.
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
        """``(keys, priorities)`` checked and grouped by shard (local keys).

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

    # ------------------------------------------------------- keys to shards
    def update_priorities(
        self, table: str, keys: Any, priorities: Any, *, wait: bool = True
    ) -> int | None:
        """:meth:`Client.update_priorities`, each key's update sent to its shard (all
        shards' requests in flight at once).

        Returns:
            How many items were updated (None with ``wait=False``).

        Raises:
            InvalidArgumentError: for keys or priorities that are malformed or name no
                shard of this client (checked for all keys before any is sent), or keys
                a shard never issued: that shard changes nothing, the others may have
                applied theirs (the error names the shards that did).
            ShardUnavailableError: for a shard down (``"fail"``; the others may have
                applied theirs).
        """
        groups = self.keys.group(*checked_update(keys, priorities))
        return routed_call(
            self.shards, self.health, "update_priorities", table, groups, wait, self.deadline()
        )

    def delete(self, table: str, keys: Any) -> int:
        """:meth:`Client.delete`, each key sent to its shard (all shards' requests in
        flight at once); how many items were removed.

        Raises:
            InvalidArgumentError: for keys that are malformed or name no shard of this
                client (checked for all keys before any is sent), or keys a shard never
                issued: that shard removes nothing, the others may have removed theirs
                (the error names the shards that did).
            ShardUnavailableError: for a shard down (``"fail"``; the others may have
                removed theirs).
        """
        groups = self.keys.group(keys)
        return routed_call(self.shards, self.health, "delete", table, groups, True, self.deadline())

    # ------------------------------------------------------------ the rest
    def reset(self, table: str) -> None:
        """:meth:`Client.reset` on every reachable shard."""
        self._each({"op": "reset", "table": table})

    def checkpoint(self, timeout: float | None = None) -> dict[int, str]:
        """:meth:`Client.checkpoint` on every reachable shard, all requests in flight at
        once; returns each shard's checkpoint directory (on its machine) by shard index.

        Each checkpoint holds what its shard acknowledged before the request reached it.
        Under ``on_shard_down="skip"`` a shard that does not answer is left out of the
        result; any other failure is raised after every shard answered, naming the shard
        and the checkpoints the others published.

        Args:
            timeout: seconds to wait for each shard (``None``: as long as it answers).

        Raises:
            InvalidArgumentError: for a bad ``timeout``, or a shard started without a
                checkpoint directory.
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
        """``table``'s :class:`TableInfo` over the reachable shards: counts and sizes
        summed, configuration from the first."""
        return merged_info(list(self.shard_info(table).values()))

    def can_insert(self, table: str, num_inserts: int = 1) -> bool:
        """Whether the shard the next insert goes to would take ``num_inserts`` now."""
        return self.inserts.can_insert(table, num_inserts, self.deadline())

    def can_sample(self, table: str, num_samples: int = 1) -> bool:
        """Whether a sample of ``num_samples`` would be served now without waiting for
        inserts (see :meth:`ShardedSampler.can_sample`; one round trip to every shard,
        all at once)."""
        n = check_count(num_samples, "num_samples")
        return self.sampler(table).can_sample(n, self.deadline())
