"""Actors and learners that meet only through replay.

Actors write through an adder, the learner samples and publishes versioned weights, and
the table's rate limiter alone holds the ratio. The backend is chosen by
:class:`RuntimeConfig`, not by code changes.

Example:
    >>> import rlreplay.runtime as rt
    >>> config = rt.RuntimeConfig(backend="threads", updates_per_env_step=0.25)
    >>> result = rt.run(config, make_env=make_env, make_policy=QPolicy,   # doctest: +SKIP
    ...                 learner=learner, replay=replay, total_env_steps=50_000)
"""

from rlreplay.errors import ComponentFailedError
from rlreplay.runtime import report
from rlreplay.runtime.actor import Actor
from rlreplay.runtime.config import POLICY_VERSION, ReplaySpec, RuntimeConfig, build_table
from rlreplay.runtime.environment_loop import ActorRecipe, EnvironmentLoop
from rlreplay.runtime.interfaces import LearnerLogic, Policy, RunResult
from rlreplay.runtime.learner import Learner
from rlreplay.runtime.run import run
from rlreplay.runtime.weights import RemoteWeights, Weights, WeightsSnapshot

__all__ = [
    "POLICY_VERSION",
    "Actor",
    "ActorRecipe",
    "ComponentFailedError",
    "EnvironmentLoop",
    "Learner",
    "LearnerLogic",
    "Policy",
    "RemoteWeights",
    "ReplaySpec",
    "RunResult",
    "RuntimeConfig",
    "Weights",
    "WeightsSnapshot",
    "build_table",
    "report",
    "run",
]
