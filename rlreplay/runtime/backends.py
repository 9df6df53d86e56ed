"""The backends: where each part of a run lives, chosen once by name.

- ``inline`` (:class:`~rlreplay.runtime.inline.InlineBackend`): actors and learner take
  turns in this thread, exactly reproducible;
- ``threads`` (:class:`ThreadsBackend`): actors in threads writing into the table here;
- ``processes`` (:class:`ProcessesBackend`): actors in processes of their own, writing
  through a replay server that serves this process's table (and the weights);
- ``ray`` (:class:`~rlreplay.distributed.ray_backend.RayBackend`): the table sharded over
  replay servers in Ray actors, the actors as Ray actors.

The concurrent ones place the parts as a :class:`~rlreplay.runtime.driver.Deployment`
and hand it to :func:`~rlreplay.runtime.driver.drive`; the learner always runs in this
process.
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
    """Actors as processes of their own; a replay server in this process serves them the
    table and the weights."""

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
    """The backend ``RuntimeConfig.backend`` names (already checked against
    :data:`~rlreplay.runtime.config.BACKENDS`)."""
    if name == "ray":  # imported only when chosen: it needs ray
        from rlreplay.distributed.ray_backend import RayBackend

        return RayBackend()
    return {"inline": InlineBackend, "threads": ThreadsBackend,
            "processes": ProcessesBackend}[name]()
