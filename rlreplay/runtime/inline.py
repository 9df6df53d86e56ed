"""The inline backend: actors and learner take turns in one thread.

The learner samples whenever the table allows, else an actor steps; refused writes never
wait and nothing depends on timing, so a seeded run is exactly reproducible.
"""

from __future__ import annotations

import threading

import numpy as np

from rlreplay.core.table import Table
from rlreplay.errors import ComponentFailedError, DeadlockError
from rlreplay.runtime.actor import NUM_COUNTERS
from rlreplay.runtime.config import ReplaySpec, RuntimeConfig, build_table
from rlreplay.runtime.environment_loop import ActorRecipe, EnvironmentLoop
from rlreplay.runtime.interfaces import LearnerLogic, OnStats, RunResult
from rlreplay.runtime.learner import Learner
from rlreplay.runtime.reporter import Reporter
from rlreplay.runtime.weights import Weights


def _failed(component: str, error: BaseException) -> ComponentFailedError:
    failure = ComponentFailedError(component, f"{type(error).__name__}: {error}")
    failure.__cause__ = error
    return failure


class InlineBackend:
    """Actors and learner take turns in this thread (see the module docstring)."""

    def run(
        self, config: RuntimeConfig, recipe: ActorRecipe, replay: ReplaySpec,
        logic: LearnerLogic, total_env_steps: int, on_stats: OnStats | None,
        max_updates: int | None,
    ) -> RunResult:
        """Run to completion in this thread; raises ComponentFailedError when a part raised,
        DeadlockError when no actor may step and no sample is allowed."""
        table = build_table(config, replay)
        learner = Learner(logic, table, Weights(), config)
        learner.publish()
        counters = np.zeros((config.num_actors, NUM_COUNTERS))
        loops: list[EnvironmentLoop] = []
        never_stop = threading.Event()  # inline runs end by themselves
        reporter = Reporter(config, table, learner, lambda: counters, total_env_steps, on_stats)
        try:
            for i in range(config.num_actors):
                try:
                    loop = recipe.build(
                        i, table, learner.weights, counters[i], never_stop, waits_for_room=False
                    )
                    loops.append(loop)
                    loop.start()
                except Exception as error:
                    raise _failed(f"actor {i}", error) from error
            while max_updates is None or learner.updates < max_updates:
                if not self._turn(config, table, learner, loops):
                    break
                if reporter.due():
                    reporter.emit()
            learner.publish_last()
            reporter.emit(final=True)
            return RunResult(reporter.rows, reporter.summary(table), table)
        finally:
            for loop in loops:
                loop.env.close()
            reporter.close()

    @staticmethod
    def _turn(
        config: RuntimeConfig, table: Table, learner: Learner, loops: list[EnvironmentLoop]
    ) -> bool:
        """One turn: the learner, a blocked actor's hand-over, or the furthest-behind actor's step;
        False when every actor finished and nothing is left to learn."""
        batch = config.batch_size
        if table.can_sample(batch):
            try:
                learner.update(table.sample(batch, timeout=config.timeout_s))
            except Exception as error:
                raise _failed("learner", error) from error
            return True
        blocked = [loop.actor for loop in loops if loop.actor.blocked]
        if blocked:
            actor = blocked[0]
            inserts = table.info().inserts
            try:
                actor.drain()
            except Exception as error:
                raise _failed(f"actor {actor.index}", error) from error
            # Stuck only when the drain handed nothing over: else the learner goes next.
            if actor.blocked and table.info().inserts == inserts:
                raise DeadlockError(
                    f"the inline run can make no progress: the table refuses actor "
                    f"{actor.index}'s pending items and allows no sample of {batch} "
                    f"({table.info().to_dict()}); raise error_buffer to hold at least one "
                    "adder chunk of items times samples_per_insert plus a batch"
                )
            return True
        ready = [loop for loop in loops if not loop.actor.finished and loop.actor.ready()]
        if not ready:
            if all(loop.actor.finished for loop in loops):
                return False
            raise DeadlockError(
                "the inline run can make no progress: the table allows no sample of "
                f"{batch} ({table.info().to_dict()}) and every actor waits for newer "
                "weights; raise max_policy_lag or make each sync period yield a batch"
            )
        loop = min(ready, key=lambda loop: loop.env_steps)
        try:
            loop.step()
            if loop.done:
                loop.actor.finish()
        except Exception as error:
            raise _failed(f"actor {loop.actor.index}", error) from error
        return True
