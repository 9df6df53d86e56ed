"""The backends: where each part of a run lives, chosen once by name.

``inline`` (:class:`~rlreplay.runtime.inline.InlineBackend`), ``threads``
(:class:`ThreadsBackend`), ``processes`` (:class:`ProcessesBackend`) and ``ray``
(:class:`~rlreplay.distributed.ray_backend.RayBackend`); the learner runs in this process.
"""

from __future__ import annotations

import threading

from rlreplay.runtime.actor_groups import ProcessActors, ThreadActors
from rlreplay.runtime.config import ReplaySpec, RuntimeConfig, build_table
from rlreplay.runtime.driver import ConcurrentBackend, Deployment
from rlreplay.runtime.environment_loop import ActorRecipe
from rlreplay.runtime.inline import InlineBackend
from rlreplay.runtime.interfaces import Backend, LearnerLogic
from rlreplay.runtime.weights import TableWeights, Weights, weights_table


class ThreadsBackend(ConcurrentBackend):
    """Actors as threads of this process, writing straight into the table."""

    def deploy(
        self, config: RuntimeConfig, recipe: ActorRecipe, replay: ReplaySpec,
        logic: LearnerLogic,
    ) -> Deployment:
        table = build_table(config, replay)
        weights = Weights()
        stop = threading.Event()
        return Deployment(table, weights, ThreadActors(recipe, table, weights, stop), stop)


class ProcessesBackend(ConcurrentBackend):
    """Actors as processes; a replay server here serves them the table and the weights."""

    def deploy(
        self, config: RuntimeConfig, recipe: ActorRecipe, replay: ReplaySpec,
        logic: LearnerLogic,
    ) -> Deployment:
        from rlreplay.net.server.server import Server

        table = build_table(config, replay)
        weights = TableWeights(weights_table(logic.params()))
        server = Server([table, weights.table], port=None).start()
        try:
            assert server.address is not None
            actors = ProcessActors(recipe, server.address, table.name)
        except BaseException:
            server.stop()
            raise
        return Deployment(table, weights, actors, threading.Event(), server.stop)


def backend_named(name: str) -> Backend:
    """The backend ``RuntimeConfig.backend`` names (already checked)."""
    if name == "ray":  # imported only when chosen: it needs ray
        from rlreplay.distributed.ray_backend import RayBackend

        return RayBackend()
    return {"inline": InlineBackend, "threads": ThreadsBackend,
            "processes": ProcessesBackend}[name]()
