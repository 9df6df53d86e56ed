"""The learner: the user's update on each batch, priorities back, weights out.

Everything runs in one thread (sample, update, priority write): helper threads would only
contend for the interpreter lock the update needs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlreplay.core.sample import Sample
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    RateLimiterTimeoutError,
    ReplayTimeoutError,
    describe,
)
from rlreplay.runtime.config import POLICY_VERSION, RuntimeConfig
from rlreplay.runtime.interfaces import LearnerLogic, ReplayTable, WeightsPublisher

# A sample waits at most this long, then the learner checks for a stop or the end.
_SAMPLE_SLICE_S = 0.1


def check_logic(logic: Any) -> None:
    """Raises :class:`~rlreplay.errors.InvalidArgumentError` unless ``logic`` is a
    :class:`~rlreplay.runtime.interfaces.LearnerLogic` instance."""
    for name in ("update", "params"):
        if isinstance(logic, type) or not callable(getattr(logic, name, None)):
            raise InvalidArgumentError(
                f"learner={describe(logic)} is not a learner instance with {name}(); give "
                "an instance providing update(batch) -> priorities | None and params() "
                "-> dict of arrays"
            )


class Learner:
    """Feeds batches to ``logic.update`` and publishes its weights.

    Args:
        logic: the user's :class:`LearnerLogic`.
        table: where priorities go (``update_priorities(keys, priorities)``).
        weights: the publisher (``publish(params) -> snapshot``).
        config: the run's configuration.

    Raises:
        InvalidArgumentError: if ``logic`` lacks ``update`` or ``params``.
    """

    def __init__(
        self, logic: LearnerLogic, table: ReplayTable, weights: WeightsPublisher,
        config: RuntimeConfig,
    ):
        check_logic(logic)
        self.logic = logic
        self.table = table
        self.weights = weights
        self.config = config
        self.updates = 0
        self.version = -1
        self.wait_s = 0.0
        self.update_s = 0.0
        self._age_lock = threading.Lock()
        self._ages: list[np.ndarray] = []
        self.age_sum = 0.0
        self.age_count = 0

    def publish(self) -> None:
        """Publish the current weights as the next version."""
        self.version = self.weights.publish(self.logic.params()).version

    def update(self, batch: Sample) -> None:
        """One update on ``batch``: priorities written back (InvalidArgumentError for a wrong
        shape), sample ages recorded, weights published every ``publish_every`` updates."""
        versions = batch.data.get(POLICY_VERSION)
        start = time.monotonic()
        priorities = self.logic.update(batch)
        self.update_s += time.monotonic() - start
        if priorities is not None:
            keys = batch.info.keys
            priorities = np.asarray(priorities, dtype=np.float64).reshape(-1)
            if priorities.shape != keys.shape:
                raise InvalidArgumentError(
                    f"update() returned {priorities.shape[0]} priorities for a batch of "
                    f"{keys.shape[0]} items; return one per item (or None)"
                )
            self.table.update_priorities(keys, priorities)
        if versions is not None:
            age = self.version - np.asarray(versions).reshape(len(batch.info.keys), -1)[:, 0]
            with self._age_lock:
                self._ages.append(age)
                self.age_sum += float(age.sum())
                self.age_count += age.size
        self.updates += 1
        if self.updates % self.config.publish_every == 0:
            self.publish()

    def take_ages(self) -> np.ndarray:
        """Sample ages (in versions) of the items learned from since the last call."""
        with self._age_lock:
            ages, self._ages = self._ages, []
        return np.concatenate(ages) if ages else np.zeros(0)

    def updates_behind(self, version: np.ndarray) -> np.ndarray:
        """Updates made since weights of ``version`` were published (policy lag)."""
        made = np.asarray(version, dtype=np.float64) * self.config.publish_every
        return np.maximum(0.0, self.updates - made)

    def run(
        self, done: Callable[[], bool], stop: threading.Event, max_updates: int | None
    ) -> None:
        """Sample and learn until ``stop``, ``max_updates``, or ``done()`` and no allowed batch is
        left; ReplayTimeoutError or ClosedError if no batch comes while actors run."""
        config = self.config
        last = time.monotonic()
        inserts = self.table.info().inserts
        while not stop.is_set() and (max_updates is None or self.updates < max_updates):
            start = time.monotonic()
            try:
                batch = self.table.sample(config.batch_size, timeout=_SAMPLE_SLICE_S)
            except RateLimiterTimeoutError:
                self.wait_s += time.monotonic() - start
                if done():
                    break
                now = self.table.info().inserts
                if now != inserts:  # the actors make progress (a long warm-up, say)
                    inserts, last = now, time.monotonic()
                if time.monotonic() - last > config.timeout_s:
                    raise ReplayTimeoutError(
                        f"the learner received no batch for {config.timeout_s}s while "
                        f"actors ran (table {self.table.info().to_dict()}); are the "
                        "actors stuck, or is min_size_to_sample above max_size?"
                    ) from None
                continue
            except ClosedError:
                if stop.is_set() or done():
                    break
                raise ClosedError(
                    f"the learner's table {describe(self.table)} was closed while the "
                    "actors ran: the run cannot go on (was its server stopped?)"
                ) from None
            self.wait_s += time.monotonic() - start
            self.update(batch)
            last = time.monotonic()
        self.publish_last()

    def publish_last(self) -> None:
        """Publish the final weights if updates happened since the last publication."""
        if self.updates % self.config.publish_every:
            self.publish()
