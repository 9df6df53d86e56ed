"""The actor: one batched policy call per vector step, one adder.

Its :class:`~rlreplay.runtime.environment_loop.EnvironmentLoop` steps the env and hands it
each observation and step. The actor pulls new weights every ``weight_sync_period`` env
steps and stamps every step it writes with the version of the weights that chose its
action, so a learner can measure policy lag from its samples. What it writes is held back
only by the table's rate limiter: a blocked write is retried in short slices, so a stop
request is noticed and the time spent blocked is counted. A batched adder stages completed
rows for ``hand_over_every`` vector steps (16 by default) and hands them over in bulk
(:mod:`rlreplay.writers.hand_over`): an item reaches the table at most that many vector
steps after its rows are complete, and the actor's flushes (before it waits for weights,
at the end) hand everything over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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
    """Acts with the newest weights it was given and writes what it saw through an adder
    (the :class:`~rlreplay.runtime.environment_loop.EnvironmentLoop` gives it the env's
    observations and steps).

    Args:
        index: this actor's number (in error messages and seeds).
        policy: a :class:`~rlreplay.runtime.interfaces.Policy`.
        adder: the adder to write through (its ``num_envs`` matches the env's).
        weights: where weights come from (``latest()``, ``wait_for(version, timeout)``).
        config: the run's configuration (sync period, lag bound, timeouts).
        num_envs: envs of the vector env it acts in.
        counters: float64 array of ``NUM_COUNTERS`` slots (this actor writes
            ``BLOCKED_S``, ``SYNCS``, ``VERSION``, ``FINISHED`` and ``WAITING``).
        stop: set to end a write that waits for room.
        waits_for_room: a write the table refuses waits for room, in slices, for up to
            ``timeout_s`` (a learner elsewhere makes room); ``False``: it only sets
            :attr:`blocked`, its rows stay pending, and the caller runs the learner.
    """

    def __init__(
        self,
        index: int,
        policy: Policy,
        adder: Adder,
        weights: WeightsSource,
        config: RuntimeConfig,
        num_envs: int,
        counters: np.ndarray,
        stop: threading.Event | Any,
        waits_for_room: bool = True,
    ):
        self.index = index
        self.policy = policy
        self.adder = adder
        self.weights = weights
        self.config = config
        self.num_envs = num_envs
        self.counters = counters
        self.stop = stop
        self.waits_for_room = waits_for_room
        self.version = -1
        # Without waits_for_room: the adder holds rows the table refused (see _write).
        self.blocked = False
        self.finished = False
        self._since_sync = 0
        self._sync_period = config.weight_sync_period
        # The extras of a policy that returns none: the version column, one read-only
        # array per loaded version (an adder may keep a reference to it).
        self._extras = self._version_extras()

    def observe_first(self, obs: Any) -> None:
        """Start the adder's episodes at ``obs`` and load the first weights.

        Raises:
            ReplayTimeoutError: if no weights are published within ``timeout_s``.
        """
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

    def select_action(self, obs: Any, env_steps: int) -> tuple[Any, dict[str, np.ndarray]]:
        """The policy's actions for ``obs`` (after pulling weights when a sync is due) and
        the extras to write with them (the weights' version among them).

        Raises:
            InvalidArgumentError: if the policy's actions are not one per env.
            ReplayTimeoutError: if weights the lag bound needs do not come in time.
        """
        if self._since_sync >= self._sync_period:
            self.sync()
        out = self.policy(obs, env_steps)
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
        return action, extras

    def observe(
        self, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
        info: Any, extras: dict[str, np.ndarray],
    ) -> None:
        """Write one vector step through the adder (see :meth:`_write` for a refusal).

        Raises:
            ReplayTimeoutError: if the table kept the write blocked ``timeout_s``.
        """
        start = time.monotonic()
        try:
            self.adder.add(action, reward, next_obs, terminated, truncated, info, extras=extras)
            self.blocked = False
        except ReplayTimeoutError:  # the step is kept: act on once the table takes it
            self._blocked(start, self.adder.hand_over)
        self._since_sync += self.num_envs

    def finish(self) -> None:
        """End open episodes (as truncated) and hand every buffered step over."""
        self.finished = True
        self._write(self.adder.close)
        if not self.blocked:
            self.counters[FINISHED] = 1

    def drain(self) -> None:
        """Hand over again what the table refused (without ``waits_for_room``; sets
        :attr:`blocked`)."""
        self._write(self.adder.close if self.finished else self.adder.flush)
        if self.finished and not self.blocked:
            self.counters[FINISHED] = 1

    def _write(self, call: Callable[[], None]) -> None:
        """Run an adder call. Without ``waits_for_room`` a refused write only sets
        :attr:`blocked` (its rows stay pending in the adder, the learner runs next). With
        it the call is repeated in slices so stop requests are noticed, for up to
        ``timeout_s``.

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
            self._blocked(start, call)

    def _blocked(self, start: float, retry: Callable[[], None]) -> None:
        """After an adder call that started at ``start`` timed out: without
        ``waits_for_room`` only set :attr:`blocked`; with it ``retry`` until the table
        takes what is due, a stop, or ``timeout_s``."""
        if not self.waits_for_room:
            self.blocked = True
            return
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
