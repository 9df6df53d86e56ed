"""Replay shards on Ray: :func:`start_shards` places replay servers as Ray actors and returns
:class:`RayShards`. The code lives in :mod:`rlreplay.distributed.ray`; importing this
module does not import Ray.
"""

from rlreplay.distributed.ray import RayShards, TablesFromConfig, start_shards

__all__ = ["RayShards", "TablesFromConfig", "start_shards"]
