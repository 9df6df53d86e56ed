"""Handles over a :class:`~rlreplay.distributed.ShardedClient`: a table, and a shard's writer."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.distributed.shard_health import ShardHealth
from rlreplay.distributed.shard_keys import ShardKeys
from rlreplay.errors import (
    ServerRestartedError,
    ServerUnavailableError,
    ShardUnavailableError,
)
from rlreplay.net.client.client import RemoteTable


class ShardedTable(RemoteTable):
    """A sharded table with the calls of a local :class:`~rlreplay.Table`."""

    def __repr__(self) -> str:
        return f"ShardedTable({self.name!r} over {self.client.addresses!r})"


class ShardWriter:
    """A :class:`~rlreplay.RemoteTrajectoryWriter` on one shard whose :attr:`keys` carry the shard.

    A silent shard raises :class:`~rlreplay.errors.ShardUnavailableError`, under ``"skip"`` too.

    Attributes:
        writer: the shard's writer.
        shard: the shard's index.
    """

    def __init__(self, writer: Any, shard: int, keys: ShardKeys, health: ShardHealth):
        self.writer = writer
        self.shard = shard
        self._keys = keys
        self._health = health

    @property
    def keys(self) -> list[np.ndarray] | None:
        """Keys of acknowledged items, one array per chunk (with ``keep_keys=True``)."""
        local = self.writer.keys
        if local is None:
            return None
        return [self._keys.to_global(k, self.shard) for k in local]

    def __getattr__(self, name: str) -> Any:
        # The writer's own calls; a silent server is named as this writer's shard.
        value = getattr(self.writer, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except (ShardUnavailableError, ServerRestartedError):
                raise
            except ServerUnavailableError as error:
                self._health.failed(self.shard, error)  # (raises it under "fail")
                raise self._health.unavailable(self.shard, error) from error

        return call

    def __enter__(self) -> ShardWriter:
        self.writer.__enter__()  # (refuses a closed writer)
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        self.__getattr__("__exit__")(exc_type, *exc)  # (its error named as every call's)

    def __repr__(self) -> str:
        return f"ShardWriter(shard {self.shard}, {self.writer!r})"
