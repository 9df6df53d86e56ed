"""The actor: one batched policy call per vector step, one adder.

It pulls weights every ``weight_sync_period`` env steps and stamps each step with their
version, so a learner can measure policy lag. See docs/runtime.md.
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

# Counter slots, written only by the actor; WAITING lets the driver spot a deadlock.
ENV_STEPS, BLOCKED_S, SYNCS, VERSION, EPISODES, RETURN_SUM, FINISHED, WAITING = range(8)
NUM_COUNTERS = 8
# Longest adder wait per call before checking for a stop request.
WRITE_SLICE_S = 0.25
# Inline: nothing makes room while it waits, so a refused write returns at once.
REFUSED_WRITE_S = 1e-3


class Actor:
    """Acts with the newest weights it was given and writes what it saw through an adder.

    Args:
        index: this actor's number (in error messages and seeds).
        policy: a :class:`~rlreplay.runtime.interfaces.Policy`.
        adder: the adder to write through (its ``num_envs`` matches the env's).
        weights: where weights come from (``latest()``, ``wait_for(version, timeout)``).
        config: the run's configuration.
        num_envs: envs of the vector env it acts in.
        counters: float64 array of ``NUM_COUNTERS`` slots, written by this actor.
        stop: set to end a write that waits for room.
        waits_for_room: retry a refused write up to ``timeout_s`` (else only set :attr:`blocked`).
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
        # Read-only version column per loaded version (an adder may keep a reference).
        self._extras = self._version_extras()

    def observe_first(self, obs: Any) -> None:
        """Start the adder's episodes at ``obs`` and load the first weights (ReplayTimeoutError if
        none come within ``timeout_s``)."""
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
        """False (adder flushed) when the lag bound makes the next step wait for newer weights."""
        if not self.needs_newer_weights():
            return True
        self._write(self.adder.flush)
        return False

    def sync(self) -> None:
        """Pull the newest weights; with ``max_policy_lag``, flush and wait (up to ``timeout_s``,
        then ReplayTimeoutError) for a newer version."""
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
        """The policy's actions for ``obs`` and the extras to write, syncing weights when due;
        InvalidArgumentError unless one action per env."""
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
        """Write one vector step through the adder (ReplayTimeoutError if blocked ``timeout_s``)."""
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
        """Hand over again what the table refused (sets :attr:`blocked`)."""
        self._write(self.adder.close if self.finished else self.adder.flush)
        if self.finished and not self.blocked:
            self.counters[FINISHED] = 1

    def _write(self, call: Callable[[], None]) -> None:
        """Run an adder call; on refusal retry in slices, or only set :attr:`blocked`."""
        start = time.monotonic()
        try:
            call()
            self.blocked = False
            return
        except ReplayTimeoutError:
            self._blocked(start, call)

    def _blocked(self, start: float, retry: Callable[[], None]) -> None:
        """After a timeout: set :attr:`blocked`, or ``retry`` until done, stopped or timed out."""
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
