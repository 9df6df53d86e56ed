"""Replay shards on Ray, under the package's short name: :func:`start_shards` places
replay servers as Ray actors and returns :class:`RayShards` (clients to pass into Ray
tasks and actors, checkpoints, shutdown).

The code lives in :mod:`rlreplay.distributed.ray`, with the rest of the scale-out layer;
importing this module does not import Ray (the helpers do when called, and say how to
install the ``ray`` extra when it is missing).
"""

from rlreplay.distributed.ray import RayShards, TablesFromConfig, start_shards

__all__ = ["RayShards", "TablesFromConfig", "start_shards"]
