"""Replay shards as Ray actors, served through a :class:`~rlreplay.ShardedClient`.

Ray only starts and stops the servers; data travels over their own sockets. Needs the
``ray`` extra. See docs/distributed.md.

Example:
    >>> import ray                                                       # doctest: +SKIP
    >>> ray.init()                                                       # doctest: +SKIP
    >>> shards = start_shards(config, num_shards=2)                      # doctest: +SKIP
    >>> client = shards.client()    # pass it into Ray tasks and actors  # doctest: +SKIP
    >>> shards.shutdown()                                                # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from rlreplay.distributed.ray_checks import (
    checked_kwargs,
    checked_resources,
    client_arguments,
    server_arguments,
    shortfall,
)
from rlreplay.distributed.sharded_client import ShardedClient
from rlreplay.errors import InvalidArgumentError, ReplayTimeoutError, check_count, describe

STRATEGIES = ("SPREAD", "STRICT_SPREAD", "PACK", "STRICT_PACK")
_WILDCARDS = ("0.0.0.0", "*", "::")


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        ImportError: naming the extra to install when Ray is missing.
    """
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "rlreplay.distributed.ray needs Ray; install it with "
            "python -m pip install 'rlreplay[ray]'"
        ) from exc
    return ray


class ShardHost:
    """The body of one shard's Ray actor: a replay server over the tables ``build()`` returns.

    Args:
        build: picklable callable returning the shard's list of tables.
        index: the shard's index (names its checkpoint folder).
        bind: host the server binds (``"0.0.0.0"``: other nodes, with CURVE or ``insecure``).
        server_kwargs: more :class:`~rlreplay.Server` arguments.
        checkpoint_dir: folder whose ``shard-<index>`` holds this shard's checkpoints, or None.
    """

    def __init__(
        self,
        build: Callable[[], list],
        index: int,
        bind: str,
        server_kwargs: dict,
        checkpoint_dir: str | None,
    ):
        self.index = index
        self.server = None
        self._error: BaseException | None = None
        try:
            self._address = self._start(build, bind, server_kwargs, checkpoint_dir)
        except Exception as error:  # re-raised by address(): Ray keeps a method's error
            self._error = error  # type, but not a failed constructor's

    def _start(self, build, bind: str, server_kwargs: dict, checkpoint_dir: str | None) -> str:
        from rlreplay.net.server.server import Server

        kwargs = dict(server_kwargs)
        if checkpoint_dir is not None:
            kwargs["checkpoint_dir"] = os.path.join(checkpoint_dir, f"shard-{self.index}")
        self.server = Server(build(), bind=bind, **kwargs).start()
        address = self.server.address
        host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
        if host in _WILDCARDS:  # reachable from other nodes at this node's address
            ray = import_ray()
            port = address.rsplit(":", 1)[1]
            address = f"tcp://{ray.util.get_node_ip_address()}:{port}"
        return address

    def address(self) -> str:
        """The server's address, reachable from the cluster.

        Raises:
            Exception: what building the tables or starting the server raised.
        """
        if self._error is not None:
            raise self._error
        return self._address

    def pid(self) -> int:
        """The process the shard serves from."""
        return os.getpid()

    def node_id(self) -> str:
        return import_ray().get_runtime_context().get_node_id()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class TablesFromConfig:
    """A picklable ``build`` for :class:`ShardHost` from a ``tables.toml``-shaped mapping."""

    def __init__(self, config: Mapping[str, Any]):
        self.config = config

    def __call__(self) -> list:
        from rlreplay.net.server.config import tables_from_config

        return tables_from_config(self.config)


class RayShards:
    """Replay shards running as Ray actors (see :func:`start_shards`).

    Attributes:
        addresses: each shard's address.
        actors: each shard's Ray actor handle.
        node_ids: the Ray node each shard runs on.
    """

    def __init__(self, actors: list, addresses: list[str], node_ids: list[str], group: Any,
                 client_kwargs: dict):
        self.actors = actors
        self.addresses = addresses
        self.node_ids = node_ids
        self._group = group
        self._client_kwargs = client_kwargs
        self._stopped = False

    def client(self, **kwargs: Any) -> ShardedClient:
        """A picklable :class:`~rlreplay.ShardedClient` over the shards (``kwargs``: overrides)."""
        return ShardedClient(self.addresses, **{**self._client_kwargs, **kwargs})

    def checkpoint(self, timeout: float | None = 60.0) -> list[str]:
        """Have every shard save a checkpoint (serving goes on) and wait; returns their folders.

        Raises:
            InvalidArgumentError: if the shards have no checkpoint folder.
            ReplayTimeoutError, ServerUnavailableError: as :meth:`Client.checkpoint`.
        """
        from rlreplay.net.client.client import Client

        clients = [Client(a, **self._client_kwargs) for a in self.addresses]
        try:
            rids = [c.transport.send({"op": "checkpoint"}, timeout=timeout) for c in clients]
            return [
                str(c.transport.wait(rid, None if timeout is None else timeout + 1.0)[0]["path"])
                for c, rid in zip(clients, rids)
            ]
        finally:
            for client in clients:
                client.close()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every shard (killed after ``timeout``), free the placement group; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        ray = import_ray()
        refs = [a.stop.remote() for a in self.actors]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=timeout)
        finally:
            for actor in self.actors:
                ray.kill(actor)
            if self._group is not None:
                ray.util.remove_placement_group(self._group)

    def __enter__(self) -> RayShards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"RayShards({self.addresses!r})"


def start_shards(
    tables: Mapping[str, Any] | Callable[[int], Callable[[], list]],
    num_shards: int,
    *,
    num_cpus: float = 1.0,
    resources: Mapping[str, float] | None = None,
    strategy: str = "SPREAD",
    bind: str = "127.0.0.1",
    server_kwargs: Mapping[str, Any] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    client_kwargs: Mapping[str, Any] | None = None,
    start_timeout: float = 120.0,
) -> RayShards:
    """Start ``num_shards`` replay servers as Ray actors, placed by a placement group.

    Call ``ray.init(...)`` first; every argument is checked before anything starts.

    Args:
        tables: a ``tables.toml``-shaped mapping, or ``tables(index)`` returning a picklable
            no-argument builder for shard ``index``.
        num_shards: shards to start (>= 1).
        num_cpus: CPUs each shard's bundle reserves.
        resources: custom resources each bundle reserves (e.g. ``{"replay": 1}``).
        strategy: the placement group's strategy, one of ``STRATEGIES``.
        bind: host each server binds (see :class:`ShardHost`).
        server_kwargs: more :class:`~rlreplay.Server` arguments (CURVE keys, limits).
        checkpoint_dir: a folder every node can reach; shard ``i`` uses ``shard-<i>``.
        client_kwargs: defaults for :meth:`RayShards.client`.
        start_timeout: seconds to wait for the placement and the servers.

    Returns:
        The :class:`RayShards` (call :meth:`RayShards.shutdown`, or use it in ``with``).

    Raises:
        InvalidArgumentError: for bad arguments, or tables a shard refuses.
        ReplayTimeoutError: if placement or server start exceeds ``start_timeout``.
        ImportError: without Ray.
    """
    num_shards = check_count(num_shards, "num_shards")
    if strategy not in STRATEGIES:
        raise InvalidArgumentError(f"strategy={strategy!r} is unknown; choose one of {STRATEGIES}")
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, float)) or num_cpus < 0:
        raise InvalidArgumentError(f"num_cpus={describe(num_cpus)} must be a number >= 0")
    if (isinstance(start_timeout, bool) or not isinstance(start_timeout, (int, float))
            or not start_timeout > 0):
        raise InvalidArgumentError(
            f"start_timeout={describe(start_timeout)} must be a number of seconds > 0"
        )
    resources = checked_resources(resources)
    server_kwargs = checked_kwargs("server_kwargs", server_kwargs, server_arguments())
    client_kwargs = checked_kwargs("client_kwargs", client_kwargs, client_arguments())
    builders = _builders(tables, num_shards)
    ray = import_ray()
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = {"CPU": float(num_cpus), **{k: float(v) for k, v in resources.items()}}
    group = None
    if any(bundle.values()):
        group = placement_group([dict(bundle) for _ in range(num_shards)], strategy=strategy)
        ready, _ = ray.wait([group.ready()], timeout=start_timeout)
        if not ready:
            ray.util.remove_placement_group(group)
            raise ReplayTimeoutError(
                f"Ray could not place {num_shards} replay shards of {bundle} each "
                f"({strategy}) within {start_timeout}s; the cluster has "
                f"{ray.available_resources()} available"
                + shortfall(ray.nodes(), bundle, num_shards, strategy)
            )

    def where(i: int) -> Any:
        # Shards that reserve nothing need no placement group (Ray refuses empty bundles).
        if group is not None:
            return PlacementGroupSchedulingStrategy(group, i)
        return "SPREAD" if "SPREAD" in strategy else "DEFAULT"

    host = ray.remote(num_cpus=0, max_concurrency=2)(ShardHost)
    folder = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
    actors = [
        host.options(
            scheduling_strategy=where(i),
            num_cpus=float(num_cpus),
            resources={k: float(v) for k, v in resources.items()} or None,
        ).remote(builders[i], i, bind, server_kwargs, folder)
        for i in range(num_shards)
    ]
    try:
        try:
            addresses = ray.get([a.address.remote() for a in actors], timeout=start_timeout)
            node_ids = ray.get([a.node_id.remote() for a in actors], timeout=start_timeout)
        except ray.exceptions.GetTimeoutError as error:
            raise ReplayTimeoutError(
                f"{num_shards} replay shards did not report their addresses within "
                f"start_timeout={start_timeout}s (building their tables, or starting "
                "their servers, took longer); give a larger start_timeout"
            ) from error
    except BaseException:
        for actor in actors:
            ray.kill(actor)
        if group is not None:
            ray.util.remove_placement_group(group)
        raise
    return RayShards(actors, addresses, node_ids, group, client_kwargs)


def _builders(tables: Any, num_shards: int) -> list[Callable[[], list]]:
    """Each shard's picklable builder of its tables; InvalidArgumentError for bad ``tables``."""
    if isinstance(tables, Mapping):
        return [TablesFromConfig(tables)] * num_shards
    if not callable(tables):
        raise InvalidArgumentError(
            f"tables={describe(tables)} must be a tables.toml-shaped mapping or a callable"
        )
    builders = [tables(i) for i in range(num_shards)]
    for i, build in enumerate(builders):
        if not callable(build):
            raise InvalidArgumentError(
                f"tables({i}) returned {describe(build)}; a callable tables must return, "
                "for a shard's index, a picklable no-argument callable that builds that "
                "shard's tables (it runs inside the shard), e.g. "
                "functools.partial(make_tables, seed=index)"
            )
    return builders
