"""``run``: actors and a learner meeting only through one replay table.

The backend ``config.backend`` names (:mod:`rlreplay.runtime.backends`) places the table,
weights, actors and learner and runs them until the actors took ``total_env_steps`` and the
learner drained what the limiter allows. A failing part becomes a
:class:`~rlreplay.errors.ComponentFailedError`; Ctrl-C stops every thread and process.
"""

from __future__ import annotations

import logging
from typing import Any

from rlreplay.errors import InvalidArgumentError, check_count, describe
from rlreplay.runtime.backends import backend_named
from rlreplay.runtime.config import ReplaySpec, RuntimeConfig
from rlreplay.runtime.environment_loop import ActorRecipe, actor_quota
from rlreplay.runtime.interfaces import LearnerLogic, OnStats, RunResult
from rlreplay.runtime.learner import check_logic

__all__ = ["RunResult", "run"]


def _check_args(
    config: RuntimeConfig, total_env_steps: Any, max_updates: Any, on_stats: Any, replay: Any
) -> int:
    """``total_env_steps`` as an int, once every argument is checked."""
    total_env_steps = check_count(total_env_steps, "total_env_steps")
    if max_updates is not None:
        check_count(max_updates, "max_updates", "or None", minimum=0)
    if on_stats is not None and not callable(on_stats):
        raise InvalidArgumentError(f"on_stats={describe(on_stats)} must be callable or None")
    if not isinstance(replay, ReplaySpec):
        raise InvalidArgumentError(f"replay={describe(replay)} must be a runtime.ReplaySpec")
    if not replay.on_policy and config.batch_size > replay.max_size:
        raise InvalidArgumentError(
            f"batch_size={config.batch_size} is more than the table holds (ReplaySpec "
            f"max_size={replay.max_size}); lower batch_size or raise max_size"
        )
    return total_env_steps


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
        learner: the user's learner (``update(batch)``, ``params()``), run in this process.
        replay: the table and adder (:class:`ReplaySpec`).
        total_env_steps: env steps to take, summed over actors and their envs.
        on_stats: ``on_stats(row, weights)`` per statistics row; its dict is merged into it.
        max_updates: stop the learner (and then the run) after this many updates.

    Returns:
        A :class:`RunResult`.

    Raises:
        InvalidArgumentError: for bad arguments (before anything starts).
        ComponentFailedError: when an actor or the learner raised or died.
    """
    if not isinstance(config, RuntimeConfig):
        raise InvalidArgumentError(f"config={describe(config)} must be a RuntimeConfig")
    total_env_steps = _check_args(config, total_env_steps, max_updates, on_stats, replay)
    if not replay.on_policy and max_updates != 0 and total_env_steps < config.min_size_to_sample:
        logging.getLogger("rlreplay").warning(
            "total_env_steps=%d is below min_size_to_sample=%d: the table will never hold "
            "enough items to sample, so the learner takes no step in this run (raise "
            "total_env_steps or lower min_size_to_sample to learn)",
            total_env_steps,
            config.min_size_to_sample,
        )
    check_logic(learner)
    recipe = ActorRecipe(
        config, make_env, make_policy, replay.adder,
        actor_quota(total_env_steps, config.num_actors),
    )
    return backend_named(config.backend).run(
        config, recipe, replay, learner, total_env_steps, on_stats, max_updates
    )
