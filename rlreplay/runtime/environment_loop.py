"""The environment loop: one vector env stepped by one actor, to a quota of env steps.

The loop owns the env and its state between calls, counts env steps and finished
episodes, and hands each observation and step to its
:class:`~rlreplay.runtime.actor.Actor`, which acts and writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.runtime.actor import (
    ENV_STEPS,
    EPISODES,
    REFUSED_WRITE_S,
    RETURN_SUM,
    WRITE_SLICE_S,
    Actor,
)
from rlreplay.runtime.config import RuntimeConfig
from rlreplay.runtime.interfaces import Policy, WeightsSource


class EnvironmentLoop:
    """Steps ``env`` with ``actor`` until ``quota`` env steps (or ``stop``).

    Args:
        env: a gymnasium vector env (either autoreset mode the actor's adder accepts).
        actor: the :class:`~rlreplay.runtime.actor.Actor` acting in it.
        quota: env steps to take in all (rounded up to whole vector steps).
        counters: the actor's float64 counters.
        stop: set to make :meth:`run` return at the next step.
        seed: the seed of the env's first reset.

    Raises:
        InvalidArgumentError: if the env is not a vector env.
    """

    def __init__(
        self, env: Any, actor: Actor, quota: int, counters: np.ndarray,
        stop: threading.Event | Any, seed: int,
    ):
        self.env = env
        self.actor = actor
        self.quota = quota
        self.counters = counters
        self.stop = stop
        self.seed = seed
        self._obs: Any = None
        self._returns = np.zeros(actor.num_envs)
        # The loop's own count (mirrored into counters[ENV_STEPS] for the statistics).
        self._env_steps = int(counters[ENV_STEPS])

    @staticmethod
    def num_envs(env: Any) -> int:
        """The vector env's number of envs (InvalidArgumentError if not a vector env)."""
        num_envs = getattr(env, "num_envs", None)
        if not isinstance(num_envs, int) or num_envs < 1:
            raise InvalidArgumentError(
                f"make_env returned {describe(env)}, which is not a vector env (no num_envs); "
                "return gym.make_vec(...) or a gymnasium.vector env"
            )
        return num_envs

    @property
    def env_steps(self) -> int:
        return self._env_steps

    @property
    def done(self) -> bool:
        """True once the quota is reached."""
        return self._env_steps >= self.quota

    def start(self) -> None:
        """Reset the env (seeded) and start the actor (ReplayTimeoutError if no weights come)."""
        obs, _ = self.env.reset(seed=self.seed)
        self._obs = obs
        self.actor.observe_first(obs)

    def step(self) -> None:
        """One vector step: the actor acts, the env steps, the actor writes the step
        (RateLimiterTimeoutError if the table blocks the write ``timeout_s``)."""
        actor = self.actor
        action, extras = actor.select_action(self._obs, self._env_steps)
        next_obs, reward, terminated, truncated, info = self.env.step(action)
        actor.observe(action, reward, next_obs, terminated, truncated, info, extras)
        returns = self._returns
        returns += reward
        ended = np.logical_or(terminated, truncated)
        if ended.any():  # (one check of both flags: the loop's own cost counts)
            counters = self.counters
            counters[EPISODES] += np.count_nonzero(ended)
            counters[RETURN_SUM] += returns[ended].sum()
            returns[ended] = 0.0
        self._obs = next_obs
        self._env_steps += actor.num_envs
        self.counters[ENV_STEPS] = self._env_steps

    def run(self) -> None:
        """Step until the quota or ``stop``, let the actor hand everything over, close the env."""
        try:
            self.start()
            while not self.done and not self.stop.is_set():
                self.step()
            if not self.stop.is_set():
                self.actor.finish()
        finally:
            self.env.close()


def actor_quota(total_env_steps: int, num_actors: int) -> int:
    """Env steps each actor takes: an equal share of the total, rounded up."""
    return -(-total_env_steps // num_actors)


@dataclass
class ActorRecipe:
    """Everything an actor is built from; picklable when its callables are module-level."""

    config: RuntimeConfig
    make_env: Callable[[int], Any]
    make_policy: Callable[[int, int, int], Policy]
    adder: Callable[..., Any]
    quota: int

    def build(
        self, index: int, writer: Any, weights: WeightsSource, counters: np.ndarray, stop: Any,
        waits_for_room: bool = True,
    ) -> EnvironmentLoop:
        """The environment loop of actor ``index``, writing through ``writer``
        (InvalidArgumentError if ``make_env`` returns no vector env)."""
        config = self.config
        seed = config.actor_seed(index)
        env = self.make_env(seed)
        try:
            num_envs = EnvironmentLoop.num_envs(env)
            policy = self.make_policy(index, config.num_actors, seed)
            if not callable(policy) or not callable(getattr(policy, "set_params", None)):
                raise InvalidArgumentError(
                    f"make_policy(index, num_actors, seed) returned {describe(policy)}, which "
                    "is not a policy (callable as policy(obs, env_steps), with set_params); "
                    "give the policy class or a factory, not an instance"
                )
            timeout = WRITE_SLICE_S if waits_for_room else REFUSED_WRITE_S
            adder = self.adder(writer, num_envs=num_envs, timeout=timeout)
            actor = Actor(index, policy, adder, weights, config, num_envs, counters, stop,
                          waits_for_room)
            return EnvironmentLoop(env, actor, self.quota, counters, stop, seed)
        except BaseException:
            env.close()
            raise
