"""The driver of the concurrent backends: actors apart, the learner in a thread, this
thread watching both.

It starts the parts of a :class:`Deployment`, emits statistics rows and stops the run
within :data:`CHECK_S` of a part failing (a
:class:`~rlreplay.errors.ComponentFailedError`); everything is stopped in reverse order.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlreplay.errors import ComponentFailedError, DeadlockError
from rlreplay.runtime.actor import FINISHED, WAITING
from rlreplay.runtime.config import ReplaySpec, RuntimeConfig
from rlreplay.runtime.environment_loop import ActorRecipe
from rlreplay.runtime.interfaces import (
    ActorGroup,
    LearnerLogic,
    OnStats,
    ReplayTable,
    RunResult,
    WeightsPublisher,
)
from rlreplay.runtime.learner import Learner
from rlreplay.runtime.reporter import Reporter

CHECK_S = 0.05  # how often the driver checks the parts


@dataclass
class Deployment:
    """What a concurrent backend started for one run.

    Attributes:
        table: the learner's handle on the replay table.
        weights: where the learner publishes its weights.
        actors: the actor group (not yet started).
        stop: the threads' stop flag, set when the run ends.
        close: stops what the backend started besides the actors.
    """

    table: ReplayTable
    weights: WeightsPublisher
    actors: ActorGroup
    stop: threading.Event
    close: Callable[[], None] = lambda: None


def drive(
    config: RuntimeConfig, deployment: Deployment, logic: LearnerLogic,
    total_env_steps: int, on_stats: OnStats | None, max_updates: int | None,
) -> RunResult:
    """Run ``deployment`` to the end, ``logic`` learning in a thread of this process; raises
    ComponentFailedError for a failed part, DeadlockError for a stuck on-policy run."""
    table, weights, actors, stop = (
        deployment.table, deployment.weights, deployment.actors, deployment.stop
    )
    with contextlib.ExitStack() as cleanup:  # runs in reverse: actors, learner, then servers
        cleanup.callback(deployment.close)
        learner = Learner(logic, table, weights, config)
        learner_error: list[BaseException] = []

        def learn() -> None:
            try:
                learner.run(actors.done, stop, max_updates)
            except BaseException as error:  # reported by the loop below
                learner_error.append(error)

        learner.publish()
        thread = threading.Thread(target=learn, name="rlreplay-learner", daemon=True)
        reporter = Reporter(config, table, learner, actors.counters, total_env_steps, on_stats)
        stall = StallWatch(config, table, learner, actors)
        cleanup.callback(reporter.close)
        cleanup.callback(_join_started, thread)
        cleanup.callback(actors.stop)
        cleanup.callback(weights.close)
        cleanup.callback(stop.set)
        actors.start()
        thread.start()
        while True:
            time.sleep(min(CHECK_S, reporter.seconds_left()))
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
    """Tells an on-policy deadlock from slow progress (every actor waits for newer weights, no
    sample allowed, no update, for 2 s); :meth:`check` then raises DeadlockError."""

    STALL_S = 2.0

    def __init__(self, config: RuntimeConfig, table: ReplayTable, learner: Learner,
                 actors: ActorGroup):
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


class ConcurrentBackend:
    """A backend whose parts run apart: :meth:`deploy` places them, :func:`drive` runs them."""

    def deploy(
        self, config: RuntimeConfig, recipe: ActorRecipe, replay: ReplaySpec,
        logic: LearnerLogic,
    ) -> Deployment:
        """Start the table, the weights and the (not yet started) actor group."""
        raise NotImplementedError

    def run(
        self, config: RuntimeConfig, recipe: ActorRecipe, replay: ReplaySpec,
        logic: LearnerLogic, total_env_steps: int, on_stats: OnStats | None,
        max_updates: int | None,
    ) -> RunResult:
        deployment = self.deploy(config, recipe, replay, logic)
        return drive(config, deployment, logic, total_env_steps, on_stats, max_updates)
