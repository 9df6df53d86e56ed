"""The driver's view of a run: a statistics row every interval, the user's hook, a summary."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.runtime.actor import ENV_STEPS
from rlreplay.runtime.interfaces import OnStats
from rlreplay.runtime.stats import StatsRecorder, StatsSinks


class Reporter:
    """Emits a row every ``stats_every_s`` seconds: statistics merged with what
    ``on_stats(row, weights)`` returns (a dict or None, else InvalidArgumentError)."""

    def __init__(
        self, config: Any, table: Any, learner: Any, counters: Callable[[], np.ndarray],
        total_env_steps: int, on_stats: OnStats | None,
    ):
        self.config = config
        self.learner = learner
        self.on_stats = on_stats
        self.rows: list[dict] = []
        self._recorder = StatsRecorder(table, learner, counters)
        self._sinks = StatsSinks(total_env_steps, config.progress, config.out_dir)
        self._counters = counters
        self._next = time.monotonic() + config.stats_every_s
        self._every_steps = config.stats_every_steps
        self._next_steps = self._every_steps or 0

    def _env_steps(self) -> int:
        return int(self._counters()[:, ENV_STEPS].sum())

    def due(self) -> bool:
        """True when a row is due: by time, or env steps reached the next ``stats_every_steps``."""
        if self._every_steps and self._env_steps() >= self._next_steps:
            return True
        return time.monotonic() >= self._next

    def seconds_left(self) -> float:
        return max(0.0, self._next - time.monotonic())

    def emit(self, final: bool = False) -> dict:
        """Compute, extend, record and show one row; ``final`` marks the run's last row."""
        row = self._recorder.row()
        row["final"] = final
        if self.on_stats is not None:
            extra = self.on_stats(row, self.learner.weights.latest())
            if extra is not None and not isinstance(extra, dict):
                raise InvalidArgumentError(
                    f"on_stats returned {describe(extra)}; return a dict of columns or None"
                )
            row.update(extra or {})
        self.rows.append(row)
        self._sinks.write(row)
        self._next = time.monotonic() + self.config.stats_every_s
        if self._every_steps:
            steps = self._env_steps()
            self._next_steps = (steps // self._every_steps + 1) * self._every_steps
        return row

    def close(self) -> None:
        self._sinks.close()

    def summary(self, table: Any) -> dict:
        """What the run did, over its whole length."""
        info = table.info()
        last = self.rows[-1] if self.rows else {}
        learner = self.learner
        return {
            "env_steps": last.get("env_steps", 0),
            "updates": learner.updates,
            "wall_s": last.get("wall_s", 0.0),
            "backend": self.config.backend,
            "num_actors": self.config.num_actors,
            "samples_per_insert_target": self.config.ratio,
            "samples_per_insert_observed": info.samples / info.inserts if info.inserts else None,
            "sample_age_mean": learner.age_sum / learner.age_count if learner.age_count else None,
            "learner_update_s": learner.update_s,
            "learner_wait_s": learner.wait_s,
            "items_inserted": info.inserts,
            "items_sampled": info.samples,
            "weight_version": learner.version,
        }
