"""The actor: one vector env, one batched policy call per vector step, one adder.

The actor keeps its env's state between calls (collecting N steps never resets an episode
half-way), pulls new weights every ``weight_sync_period`` env steps and stamps every step
it writes with the version of the weights that chose its action, so a learner can measure
policy lag from its samples. What it writes is held back only by the table's rate limiter:
a blocked write is retried in short slices, so a stop request is noticed and the time spent
blocked is counted. A batched adder stages completed rows for ``hand_over_every`` vector
steps (16 by default) and hands them over in bulk (:mod:`rlreplay.writers.hand_over`):
an item reaches the table at most that many vector steps after its rows are complete, and
the actor's flushes (before it waits for weights, at the end) hand everything over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlreplay.errors import ClosedError, InvalidArgumentError, ReplayTimeoutError, describe
from rlreplay.runtime.config import POLICY_VERSION, RuntimeConfig
from rlreplay.runtime.interfaces import Adder, Policy, WeightsSource

# Slots of an actor's counters array (a plain array in threads, shared memory across
# processes): read by the statistics, written only by the actor.
# FINISHED is 1 once the actor handed every step over; WAITING is 1 while it waits for
# newer weights (max_policy_lag), so the driver can tell a deadlock from slow progress.
ENV_STEPS, BLOCKED_S, SYNCS, VERSION, EPISODES, RETURN_SUM, FINISHED, WAITING = range(8)
NUM_COUNTERS = 8
# An actor that waits for room (beside a learner that makes it) lets its adder wait at
# most this long per call, then checks for a stop request and hands the rest over again.
WRITE_SLICE_S = 0.25
# One that does not (inline: nothing can make room while it waits) lets a write the
# limiter refuses return at once, its rows pending in the adder, and the learner goes next.
REFUSED_WRITE_S = 1e-3


class Actor:
    """Steps ``env`` with ``policy`` and writes through ``adder``.

    Args:
        index: this actor's number (in error messages and seeds).
        env: a gymnasium vector env (either autoreset mode the adder accepts).
        policy: a :class:`Policy`.
        adder: the adder to write through (its ``num_envs`` matches the env's).
        weights: where weights come from (``latest()``, ``wait_for(version, timeout)``).
        config: the run's configuration (sync period, lag bound, seeds, timeouts).
        quota: env steps this actor takes in all (rounded up to whole vector steps).
        counters: float64 array of ``NUM_COUNTERS`` slots this actor writes.
        stop: set to make :meth:`run` return at the next step.
        waits_for_room: a write the table refuses waits for room, in slices, for up to
            ``timeout_s`` (a learner elsewhere makes room); ``False``: it only sets
            :attr:`blocked`, its rows stay pending, and the caller runs the learner.

    Raises:
        InvalidArgumentError: if the env is not a vector env.
    """

    def __init__(
        self,
        index: int,
        env: Any,
        policy: Policy,
        adder: Adder,
        weights: WeightsSource,
        config: RuntimeConfig,
        quota: int,
        counters: np.ndarray,
        stop: threading.Event | Any,
        waits_for_room: bool = True,
    ):
        num_envs = getattr(env, "num_envs", None)
        if not isinstance(num_envs, int) or num_envs < 1:
            raise InvalidArgumentError(
                f"make_env returned {describe(env)}, which is not a vector env (no num_envs); "
                "return gym.make_vec(...) or a gymnasium.vector env"
            )
        self.index = index
        self.env = env
        self.num_envs = num_envs
        self.policy = policy
        self.adder = adder
        self.weights = weights
        self.config = config
        self.quota = quota
        self.counters = counters
        self.stop = stop
        self.waits_for_room = waits_for_room
        self.version = -1
        # Without waits_for_room: the adder holds rows the table refused (see _write).
        self.blocked = False
        self.finished = False
        self._obs: Any = None
        self._returns = np.zeros(num_envs)
        self._since_sync = 0
        self._sync_period = config.weight_sync_period
        # The actor's own count (mirrored into counters[ENV_STEPS] for the statistics).
        self._env_steps = int(counters[ENV_STEPS])
        # The extras of a policy that returns none: the version column, one read-only
        # array per loaded version (an adder may keep a reference to it).
        self._extras = self._version_extras()

    @property
    def env_steps(self) -> int:
        return self._env_steps

    @property
    def done(self) -> bool:
        """True once the quota is reached."""
        return self._env_steps >= self.quota

    def start(self) -> None:
        """Reset the env (seeded) and the adder, and load the first weights.

        Raises:
            ReplayTimeoutError: if no weights are published within ``timeout_s``.
        """
        obs, _ = self.env.reset(seed=self.config.actor_seed(self.index))
        self._obs = obs
        self.adder.reset(obs)
        self._load(self.weights.wait_for(0, self.config.timeout_s))

    def _load(self, snapshot: Any) -> None:
        self.policy.set_params(dict(snapshot.params))
        self.version = snapshot.version
        self._extras = self._version_extras()
        self.counters[VERSION] = snapshot.version
        self.counters[SYNCS] += 1
        self._since_sync = 0

    def _version_extras(self) -> dict[str, np.ndarray]:
        column = np.full(self.num_envs, self.version, np.int64)
        column.flags.writeable = False
        return {POLICY_VERSION: column}

    def needs_newer_weights(self) -> bool:
        """True when the lag bound makes the next step wait for a newer version."""
        lag = self.config.max_policy_lag
        if lag is None or self._since_sync < self.config.weight_sync_period:
            return False
        latest = self.weights.latest()
        return latest is None or latest.version <= self.version

    def ready(self) -> bool:
        """False when the lag bound makes the next step wait for newer weights; the
        adder is flushed then, so the learner has the data it needs to publish them."""
        if not self.needs_newer_weights():
            return True
        self._write(self.adder.flush)
        return False

    def sync(self) -> None:
        """Pull the newest weights; with ``max_policy_lag`` wait (flushing the adder first,
        so the learner has the data it needs to publish) for a version recent enough.

        Raises:
            ReplayTimeoutError: if the needed version does not come within ``timeout_s``.
        """
        lag = self.config.max_policy_lag
        if lag is None:
            latest = self.weights.latest()
        else:
            self._write(self.adder.flush)
            start = time.monotonic()
            self.counters[WAITING] = 1
            try:
                latest = self.weights.wait_for(self.version + 1, self.config.timeout_s)
            finally:
                self.counters[WAITING] = 0
                self.counters[BLOCKED_S] += time.monotonic() - start
        if latest is not None and latest.version != self.version:
            self._load(latest)
        else:
            self._since_sync = 0

    def step(self) -> None:
        """One vector step: act, step the env, write the step.

        Raises:
            RateLimiterTimeoutError: if the table kept the write blocked ``timeout_s``.
        """
        if self._since_sync >= self._sync_period:
            self.sync()
        out = self.policy(self._obs, self._env_steps)
        if type(out) is tuple:
            action, extras = out
            extras = {**extras, **self._extras}
        else:
            action, extras = out, self._extras
        shape = action.shape if type(action) is np.ndarray else np.shape(action)
        if shape[:1] != (self.num_envs,):
            raise InvalidArgumentError(
                f"the policy returned actions {describe(action)} of shape {shape} "
                f"for {self.num_envs} envs; return one action per env (first axis "
                f"{self.num_envs}), as a numpy array"
            )
        next_obs, reward, terminated, truncated, info = self.env.step(action)
        start = time.monotonic()
        try:
            self.adder.add(action, reward, next_obs, terminated, truncated, info, extras=extras)
            self.blocked = False
        except ReplayTimeoutError:
            self._blocked(start, None)
        returns = self._returns
        returns += reward
        ended = np.logical_or(terminated, truncated)
        if ended.any():  # (one check of both flags: the loop's own cost counts)
            counters = self.counters
            counters[EPISODES] += np.count_nonzero(ended)
            counters[RETURN_SUM] += returns[ended].sum()
            returns[ended] = 0.0
        self._obs = next_obs
        self._env_steps += self.num_envs
        self.counters[ENV_STEPS] = self._env_steps
        self._since_sync += self.num_envs

    def finish(self) -> None:
        """End open episodes (as truncated) and hand every buffered step over."""
        self.finished = True
        self._write(self.adder.close, retry=self.adder.close)
        if not self.blocked:
            self.counters[FINISHED] = 1

    def drain(self) -> None:
        """Hand over again what the table refused (without ``waits_for_room``; sets
        :attr:`blocked`)."""
        self._write(self.adder.close if self.finished else self.adder.flush)
        if self.finished and not self.blocked:
            self.counters[FINISHED] = 1

    def _write(self, call: Callable[[], None], retry: Callable[[], None] | None = None) -> None:
        """Run an adder call. Without ``waits_for_room`` a refused write only sets
        :attr:`blocked` (its rows stay pending in the adder, the learner runs next). With
        it the rest is handed over in slices (``retry``, default ``adder.flush``) so stop
        requests are noticed, for up to ``timeout_s``.

        Raises:
            ReplayTimeoutError: if the table kept the write blocked ``timeout_s``.
            ClosedError: if the run stopped while the write was blocked.
        """
        start = time.monotonic()
        try:
            call()
            self.blocked = False
            return
        except ReplayTimeoutError:
            self._blocked(start, retry)

    def _blocked(self, start: float, retry: Callable[[], None] | None) -> None:
        """After an adder call that started at ``start`` timed out: see :meth:`_write`."""
        if not self.waits_for_room:
            self.blocked = True
            return
        retry = retry or self.adder.flush
        while True:
            waited = time.monotonic() - start
            if self.stop.is_set():
                self.counters[BLOCKED_S] += waited
                raise ClosedError("the run stopped while the actor's write was blocked")
            if waited > self.config.timeout_s:
                self.counters[BLOCKED_S] += waited
                raise ReplayTimeoutError(
                    f"the table kept actor {self.index}'s writes blocked for {waited:.1f}s "
                    f"(timeout_s={self.config.timeout_s}); the learner is not sampling"
                )
            try:
                retry()
                self.counters[BLOCKED_S] += time.monotonic() - start
                return
            except ReplayTimeoutError:
                continue

    def run(self) -> None:
        """Start, then step until the quota is reached or ``stop`` is set; then close
        the adder (open episodes end as truncated) and the env."""
        try:
            self.start()
            while not self.done and not self.stop.is_set():
                self.step()
            if not self.stop.is_set():
                self.finish()
        finally:
            self.env.close()


def actor_quota(total_env_steps: int, num_actors: int) -> int:
    """Env steps each actor takes: an equal share of the total, rounded up."""
    return -(-total_env_steps // num_actors)


@dataclass
class ActorRecipe:
    """Everything an actor is built from; picklable when its callables are (module-level
    functions and classes), so the processes backend can send it to a new process."""

    config: RuntimeConfig
    make_env: Callable[[int], Any]
    make_policy: Callable[[int, int, int], Policy]
    adder: Callable[..., Any]
    quota: int

    def build(
        self, index: int, writer: Any, weights: WeightsSource, counters: np.ndarray, stop: Any,
        waits_for_room: bool = True,
    ) -> Actor:
        """Actor ``index`` writing through ``writer`` (a table, or a remote writer); see
        :class:`Actor` for ``waits_for_room``.

        Raises:
            InvalidArgumentError: if ``make_env`` does not return a vector env.
        """
        config = self.config
        seed = config.actor_seed(index)
        env = self.make_env(seed)
        try:
            policy = self.make_policy(index, config.num_actors, seed)
            if not callable(policy) or not callable(getattr(policy, "set_params", None)):
                raise InvalidArgumentError(
                    f"make_policy(index, num_actors, seed) returned {describe(policy)}, which "
                    "is not a policy (callable as policy(obs, env_steps), with set_params); "
                    "give the policy class or a factory, not an instance"
                )
            num_envs = getattr(env, "num_envs", None)
            timeout = WRITE_SLICE_S if waits_for_room else REFUSED_WRITE_S
            adder = self.adder(writer, num_envs=num_envs, timeout=timeout)
            return Actor(index, env, policy, adder, weights, config, self.quota, counters, stop,
                         waits_for_room)
        except BaseException:
            env.close()
            raise
