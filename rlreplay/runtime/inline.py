"""The inline backend: actors and learner take turns in one thread.

The rule is the rate limiter's: whenever the table allows a sample, the learner takes one
batch; otherwise an actor whose adder holds items the table refused hands them over again,
or else the actor with the fewest env steps takes one vector step. A write the limiter
refuses never waits (it returns at once and stays pending in the adder), so the learner can
catch up in between, whatever the number of envs. Nothing
depends on timing, so a seeded run is exactly reproducible: the same seeds give the same
batches, the same updates and the same weights, step for step. With ``max_policy_lag``,
an actor that needs newer weights hands its data over and waits its turn; when neither
side can move the run raises instead of hanging.
"""

from __future__ import annotations

import threading

import numpy as np

from rlreplay.errors import ComponentFailedError, DeadlockError
from rlreplay.runtime.actor import NUM_COUNTERS, Actor, ActorRecipe
from rlreplay.runtime.config import ReplaySpec, RuntimeConfig, build_table
from rlreplay.runtime.interfaces import LearnerLogic, RunResult
from rlreplay.runtime.learner import Learner
from rlreplay.runtime.reporter import OnStats, Reporter
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
        """Run to completion in this thread.

        Raises:
            ComponentFailedError: when an actor or the learner raised.
            DeadlockError: when no actor may step and the table allows no sample.
        """
        table = build_table(config, replay)
        learner = Learner(logic, table, Weights(), config)
        learner.publish()
        counters = np.zeros((config.num_actors, NUM_COUNTERS))
        actors: list[Actor] = []
        never_stop = threading.Event()  # inline runs end by themselves
        reporter = Reporter(config, table, learner, lambda: counters, total_env_steps, on_stats)
        try:
            for i in range(config.num_actors):
                try:
                    actor = recipe.build(
                        i, table, learner.weights, counters[i], never_stop, waits_for_room=False
                    )
                    actors.append(actor)
                    actor.start()
                except Exception as error:
                    raise _failed(f"actor {i}", error) from error
            batch = config.batch_size
            while max_updates is None or learner.updates < max_updates:
                if table.can_sample(batch):
                    try:
                        learner.update(table.sample(batch, timeout=config.timeout_s))
                    except Exception as error:
                        raise _failed("learner", error) from error
                elif any(a.blocked for a in actors):
                    actor = next(a for a in actors if a.blocked)
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
                else:
                    ready = [a for a in actors if not a.finished and a.ready()]
                    if not ready:
                        if all(a.finished for a in actors):
                            break
                        raise DeadlockError(
                            "the inline run can make no progress: the table allows no sample of "
                            f"{batch} ({table.info().to_dict()}) and every actor waits for newer "
                            "weights; raise max_policy_lag or make each sync period yield a batch"
                        )
                    actor = min(ready, key=lambda a: a.env_steps)
                    try:
                        actor.step()
                        if actor.done:
                            actor.finish()
                    except Exception as error:
                        raise _failed(f"actor {actor.index}", error) from error
                if reporter.due():
                    reporter.emit()
            learner.publish_last()
            reporter.emit(final=True)
            return RunResult(reporter.rows, reporter.summary(table), table)
        finally:
            for actor in actors:
                actor.env.close()
            reporter.close()
