"""``run``: actors and a learner meeting only through one replay table.

The driver builds the table (its rate limiter holds the ratio), publishes the initial
weights as version 0, starts the actors and the learner on the chosen backend and, until
the actors took ``total_env_steps`` and the learner drained what the limiter allows,
emits a statistics row every interval and checks that every part is alive. A part that
raises or dies stops the run within a second and becomes a
:class:`~rlreplay.errors.ComponentFailedError` naming it; Ctrl-C stops every thread and
process before it propagates.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

from rlreplay.core.table import Table
from rlreplay.errors import ComponentFailedError, DeadlockError, InvalidArgumentError, describe
from rlreplay.runtime.actor import FINISHED, WAITING, ActorRecipe, actor_quota
from rlreplay.runtime.actor_groups import ProcessActors, ThreadActors
from rlreplay.runtime.config import ReplaySpec, RuntimeConfig, build_table
from rlreplay.runtime.inline import run_inline
from rlreplay.runtime.learner import Learner, LearnerLogic
from rlreplay.runtime.reporter import OnStats, Reporter
from rlreplay.runtime.weights import TableWeights, Weights, weights_table

_CHECK_S = 0.05


@dataclass
class RunResult:
    """What :func:`run` returns: the statistics ``rows``, a ``summary`` and the ``table``."""

    rows: list[dict]
    summary: dict
    table: Table


def _check_args(total_env_steps: Any, max_updates: Any, on_stats: Any, replay: Any) -> None:
    if isinstance(total_env_steps, bool) or not isinstance(total_env_steps, int) or (
        total_env_steps < 1
    ):
        raise InvalidArgumentError(
            f"total_env_steps={describe(total_env_steps)} must be an int >= 1"
        )
    if max_updates is not None and (
        isinstance(max_updates, bool) or not isinstance(max_updates, int) or max_updates < 0
    ):
        raise InvalidArgumentError(f"max_updates={describe(max_updates)} must be None or >= 0")
    if on_stats is not None and not callable(on_stats):
        raise InvalidArgumentError(f"on_stats={describe(on_stats)} must be callable or None")
    if not isinstance(replay, ReplaySpec):
        raise InvalidArgumentError(f"replay={describe(replay)} must be a runtime.ReplaySpec")


def run(
    config: RuntimeConfig,
    *,
    make_env: Any,
    make_policy: Any,
    learner: LearnerLogic,
    replay: ReplaySpec,
    total_env_steps: int,
    on_stats: OnStats | None = None,
    max_updates: int | None = None,
) -> RunResult:
    """Train: actors fill the replay table, the learner samples it, at the held ratio.

    Args:
        config: the run's knobs (:class:`RuntimeConfig`).
        make_env: ``make_env(seed)`` returns a gymnasium vector env.
        make_policy: ``make_policy(actor_index, num_actors, seed)`` returns a policy
            (``set_params(params)``, ``policy(obs, env_steps) -> actions``).
        learner: the user's learner (``update(batch)``, ``params()``); it runs in this
            process whatever the backend.
        replay: the table and adder (:class:`ReplaySpec`).
        total_env_steps: env steps to take, summed over actors and their envs.
        on_stats: ``on_stats(row, weights)`` called in this thread once per statistics
            row (evaluation goes here); the dict it returns is merged into the row.
        max_updates: stop the learner (and then the run) after this many updates.

    Returns:
        A :class:`RunResult`.

    Raises:
        InvalidArgumentError: for bad arguments (before anything starts).
        ComponentFailedError: when an actor or the learner raised or died.
    """
    if not isinstance(config, RuntimeConfig):
        raise InvalidArgumentError(f"config={describe(config)} must be a RuntimeConfig")
    _check_args(total_env_steps, max_updates, on_stats, replay)
    recipe = ActorRecipe(
        config, make_env, make_policy, replay.adder,
        actor_quota(total_env_steps, config.num_actors),
    )
    if config.backend == "ray":  # the table lives on the shards the backend starts
        return _run_concurrent(config, recipe, replay, learner, total_env_steps, on_stats,
                               max_updates)
    table = build_table(config, replay)
    if config.backend == "inline":
        weights = Weights()
        parts = Learner(learner, table, weights, config)
        parts.publish()
        return run_inline(config, recipe, table, parts, total_env_steps, on_stats, max_updates)
    return _run_concurrent(config, recipe, table, learner, total_env_steps, on_stats, max_updates)


def _run_concurrent(
    config: RuntimeConfig, recipe: ActorRecipe, table: Any, logic: LearnerLogic,
    total_env_steps: int, on_stats: OnStats | None, max_updates: int | None,
) -> RunResult:
    """The threads, processes and ray backends: actors apart, the learner in a thread
    here, this thread watching both (``table``: the replay spec for ray)."""
    stop = threading.Event()
    server = None
    if config.backend == "ray":
        from rlreplay.distributed.ray_backend import RayDeployment

        server = RayDeployment(config, recipe, table, logic.params())
        table, weights, actors = server.table, server.weights, server.actors
        try:
            learner = Learner(logic, table, weights, config)
        except BaseException:
            server.stop()
            raise
    elif config.backend == "processes":
        from rlreplay.net.server import Server

        first = logic.params()
        weights: Weights = TableWeights(weights_table(first))
        learner = Learner(logic, table, weights, config)
        server = Server([table, weights.table], port=None).start()
        assert server.address is not None
        actors: Any = ProcessActors(recipe, server.address, table.name)
    else:
        weights = Weights()
        learner = Learner(logic, table, weights, config)
        actors = ThreadActors(recipe, table, weights, stop)
    learner_error: list[BaseException] = []

    def learn() -> None:
        try:
            learner.run(actors.done, stop, max_updates)
        except BaseException as error:  # reported by the driver loop
            learner_error.append(error)

    learner.publish()
    thread = threading.Thread(target=learn, name="rlreplay-learner", daemon=True)
    reporter = Reporter(config, table, learner, actors.counters, total_env_steps, on_stats)
    stall = StallWatch(config, table, learner, actors)
    with contextlib.ExitStack() as cleanup:  # runs in reverse: actors, learner, then server
        if server is not None:
            cleanup.callback(server.stop)
        cleanup.callback(reporter.close)
        cleanup.callback(_join_started, thread)
        cleanup.callback(actors.stop)
        cleanup.callback(weights.close)
        cleanup.callback(stop.set)
        actors.start()
        thread.start()
        while True:
            time.sleep(min(_CHECK_S, reporter.seconds_left()))
            actors.check()
            if learner_error:
                error = learner_error[0]
                raise ComponentFailedError(
                    "learner", f"{type(error).__name__}: {error}"
                ) from error
            if not thread.is_alive():
                break  # drained after the actors finished, or max_updates reached
            stall.check()
            if reporter.due():
                reporter.emit()
        reporter.emit(final=True)
        return RunResult(reporter.rows, reporter.summary(table), table)


def _join_started(thread: threading.Thread) -> None:
    if thread.ident is not None:
        thread.join(5.0)


class StallWatch:
    """Tells an on-policy deadlock from slow progress: every actor waits for newer
    weights, the table allows no sample and the learner made no update, for 2 s.

    Raises (from :meth:`check`):
        DeadlockError: naming the cause (one sync period must yield a batch).
    """

    STALL_S = 2.0

    def __init__(self, config: RuntimeConfig, table: Table, learner: Learner, actors: Any):
        self.config = config
        self.table = table
        self.learner = learner
        self.actors = actors
        self._since: float | None = None
        self._updates = -1

    def check(self) -> None:
        if self.config.max_policy_lag is None:
            return
        counters = self.actors.counters()
        waiting = (counters[:, WAITING] == 1) | (counters[:, FINISHED] == 1)
        stuck = (
            bool(waiting.all())
            and not bool(counters[:, FINISHED].all())
            and not self.table.can_sample(self.config.batch_size)
            and self.learner.updates == self._updates
        )
        self._updates = self.learner.updates
        if not stuck:
            self._since = None
            return
        now = time.monotonic()
        self._since = self._since or now
        if now - self._since > self.STALL_S:
            raise DeadlockError(
                f"the run can make no progress: every actor waits for newer weights and the "
                f"table allows no sample of batch_size={self.config.batch_size} "
                f"({self.table.info().size} items wait); with max_policy_lag=0 each sync "
                "period (weight_sync_period env steps, all actors) must yield a batch"
            )
