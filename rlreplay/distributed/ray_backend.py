"""The runtime's ``ray`` backend: shards and actors as Ray actors, the learner in the driver."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
from typing import Any

import numpy as np

from rlreplay.core.selectors import Prioritized, Uniform
from rlreplay.distributed.ray import RayShards, import_ray, start_shards
from rlreplay.errors import ClosedError, ComponentFailedError, InvalidArgumentError
from rlreplay.runtime.actor import FINISHED, NUM_COUNTERS
from rlreplay.runtime.actor_groups import actor_writer
from rlreplay.runtime.config import ReplaySpec, RuntimeConfig, build_table
from rlreplay.runtime.driver import ConcurrentBackend, Deployment
from rlreplay.runtime.environment_loop import ActorRecipe
from rlreplay.runtime.interfaces import LearnerLogic
from rlreplay.runtime.weights import WEIGHTS_TABLE, TableWeights, weights_table

_COUNTERS_S = 0.1  # the driver reads the actors' counters at most this often


def shard_config(config: RuntimeConfig, replay: ReplaySpec, index: int):
    """The run's config and replay spec for shard ``index`` (its share of sizes and actors)."""
    n = config.replay_shards
    shard = dataclasses.replace(
        config,
        backend="threads",
        replay_shards=1,
        seed=config.seed + 7919 * index,
        num_actors=max(1, math.ceil(config.num_actors / n)),
        min_size_to_sample=max(1, math.ceil(config.min_size_to_sample / n)),
        error_buffer=config.limiter_buffer(),
    )
    return shard, dataclasses.replace(replay, max_size=max(1, math.ceil(replay.max_size / n)))


def check_shardable(config: RuntimeConfig, replay: ReplaySpec) -> None:
    """Refuse a table that cannot be sharded, before anything starts.

    Raises:
        InvalidArgumentError: for a queue table, a sampler not Uniform or Prioritized, or
            fewer actors than shards (with ``replay_shards > 1``).
    """
    if config.replay_shards == 1:
        return
    if replay.on_policy:
        raise InvalidArgumentError(
            f"replay_shards={config.replay_shards} cannot shard an on-policy queue table "
            "(its items are sampled once, in order); use replay_shards=1"
        )
    if replay.sampler is not None and not isinstance(replay.sampler, (Uniform, Prioritized)):
        raise InvalidArgumentError(
            f"replay_shards={config.replay_shards} samples over shards with a Uniform or "
            f"Prioritized sampler, not {replay.sampler!r}; use one of those or "
            "replay_shards=1"
        )
    if config.num_actors < config.replay_shards:
        raise InvalidArgumentError(
            f"replay_shards={config.replay_shards} is more than num_actors="
            f"{config.num_actors}: actor i writes to shard i % replay_shards, so shards "
            f"{config.num_actors}..{config.replay_shards - 1} would get no steps and their "
            "share of max_size would stay empty; use replay_shards <= num_actors"
        )


class ShardTables:
    """Picklable builder of shard ``index``'s tables; shard 0 also hosts the weights table."""

    def __init__(self, config: RuntimeConfig, replay: ReplaySpec, index: int, first: dict):
        self.config, self.replay, self.index, self.first = config, replay, index, first

    def __call__(self) -> list:
        config, replay = shard_config(self.config, self.replay, self.index)
        tables = [build_table(config, replay)]
        if self.index == 0:
            tables.append(weights_table(self.first))
        return tables


class ActorHost:
    """One runtime actor inside a Ray actor (threaded, so the driver can read and stop it)."""

    def __init__(self, index: int, recipe: ActorRecipe, client: Any, table: str, shard: int):
        self.index, self.recipe, self.client = index, recipe, client
        self.table, self.shard = table, shard
        self._counters = np.zeros(NUM_COUNTERS)
        self._stop = threading.Event()

    def run(self) -> None:
        """The actor loop, until its quota or :meth:`stop`.

        Raises:
            Exception: what the actor raised (the driver reports it).
        """
        from rlreplay.runtime.weights import RemoteWeights

        writer = None
        try:
            per_shard = math.ceil(self.recipe.config.num_actors / self.client.num_shards)
            writer = actor_writer(self.client, self.table, per_shard, shard=self.shard)
            weights = RemoteWeights(self.client.shards[0], stop=self._stop)
            actor = self.recipe.build(self.index, writer, weights, self._counters, self._stop)
            actor.run()
        except ClosedError:
            if not self._stop.is_set():
                raise
        finally:
            if writer is not None and self._stop.is_set():
                with contextlib.suppress(Exception):
                    writer.close(timeout=0.05)

    def counters(self) -> np.ndarray:
        return self._counters.copy()

    def stop(self) -> None:
        self._stop.set()


class RayActors:
    """Actors as Ray actors, with the actor-group interface of the other backends."""

    def __init__(self, recipe: ActorRecipe, client: Any, table: str):
        self.recipe, self.client, self.table = recipe, client, table
        n = recipe.config.num_actors
        self._counters = np.zeros((n, NUM_COUNTERS))
        self._read_at = -math.inf
        self._handles: list = []
        self._runs: list = []

    def start(self) -> None:
        ray = import_ray()
        host = ray.remote(num_cpus=0, max_concurrency=2)(ActorHost)
        shards = self.client.num_shards
        for i in range(self.recipe.config.num_actors):
            handle = host.options(name=None).remote(
                i, self.recipe, self.client, self.table, i % shards
            )
            self._handles.append(handle)
            self._runs.append(handle.run.remote())

    def counters(self) -> np.ndarray:
        now = time.monotonic()
        if self._handles and now - self._read_at >= _COUNTERS_S:
            ray = import_ray()
            with contextlib.suppress(Exception):  # a dead actor is reported by check()
                rows = ray.get([h.counters.remote() for h in self._handles], timeout=5.0)
                self._counters[:] = np.stack(rows)
            self._read_at = now
        return self._counters

    def done(self) -> bool:
        return bool(self._handles) and bool(self.counters()[:, FINISHED].all())

    def check(self) -> None:
        """Raises ComponentFailedError for an actor whose loop raised or whose Ray actor died."""
        if not self._runs:
            return
        ray = import_ray()
        ready, _ = ray.wait(self._runs, num_returns=len(self._runs), timeout=0)
        for ref in ready:
            index = self._runs.index(ref)
            try:
                ray.get(ref)
            except Exception as error:
                raise ComponentFailedError(
                    f"actor {index}", f"{type(error).__name__}: {error}"
                ) from error

    def stop(self, timeout: float = 5.0) -> None:
        """Ask every actor to stop, wait ``timeout`` s for all together, kill the rest."""
        if not self._handles:
            return
        ray = import_ray()
        for handle in self._handles:
            with contextlib.suppress(Exception):
                handle.stop.remote()
        ray.wait(self._runs, num_returns=len(self._runs), timeout=timeout)
        for handle in self._handles:
            ray.kill(handle)
        self._handles, self._runs = [], []


class RayDeployment:
    """Everything the ray backend starts; :meth:`stop` ends them all (and Ray, if it started it).

    Args:
        config: the run's config (``replay_shards`` shards).
        recipe: how actors are built.
        replay: the table spec.
        first: the learner's initial params (they size the weights table).
    """

    def __init__(self, config: RuntimeConfig, recipe: ActorRecipe, replay: ReplaySpec,
                 first: dict):
        check_shardable(config, replay)
        ray = import_ray()
        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            ray.init(include_dashboard=False, log_to_driver=False)
        self.shards: RayShards | None = None
        try:
            n = config.replay_shards
            self.shards = start_shards(
                lambda i: ShardTables(config, replay, i, first), n, num_cpus=0
            )
            self.client = self.shards.client(first_shard=0, seed=config.seed)
            # one shard: its own table's calls (any sampler, queues included)
            self.table = (
                self.client.table(replay.name) if n > 1
                else self.client.shards[0].table(replay.name)
            )
            self.weights = TableWeights(self.client.shards[0].table(WEIGHTS_TABLE))
            self.actors = RayActors(recipe, self.client, replay.name)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the shards (the actors are stopped by the driver first)."""
        if self.shards is not None:
            self.shards.shutdown()
            self.shards = None
        if self._own_ray:
            import_ray().shutdown()
            self._own_ray = False


class RayBackend(ConcurrentBackend):
    """The ``ray`` backend: sharded table and actors in Ray actors, the learner in this process."""

    def deploy(
        self, config: RuntimeConfig, recipe: ActorRecipe, replay: ReplaySpec,
        logic: LearnerLogic,
    ) -> Deployment:
        started = RayDeployment(config, recipe, replay, logic.params())
        return Deployment(
            started.table, started.weights, started.actors, threading.Event(), started.stop
        )
