"""Statistics like Ape-X's, one row per interval, to a progress bar, CSV and TensorBoard.

Besides speeds, ratio and waits, a row has ``policy_lag_*`` (learner updates since each
actor's weights were published) and ``sample_age_*`` (versions between the weights that
acted a sampled step and the learner's).
"""

from __future__ import annotations

import csv
import importlib.util
import logging
import os
import time
from typing import Any

import numpy as np

from rlreplay.runtime.actor import BLOCKED_S, ENV_STEPS, EPISODES, RETURN_SUM, SYNCS, VERSION

log = logging.getLogger("rlreplay.runtime")

COLUMNS = (
    "env_steps", "wall_s", "env_steps_per_s", "updates", "updates_per_s", "samples_per_insert",
    "samples_per_insert_total", "items_inserted", "items_sampled", "learner_wait_frac",
    "actor_blocked_frac", "weight_syncs", "weight_version",
    "policy_lag_min", "policy_lag_mean", "policy_lag_max",
    "sample_age_min", "sample_age_mean", "sample_age_max", "table_size",
    "episodes", "train_return", "final",
)


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den > 0 else float("nan")


class StatsRecorder:
    """Turns the components' counters into rows, one per call to :meth:`row`.

    Args:
        table: the replay table (``info()`` gives inserts, samples, size).
        learner: the :class:`~rlreplay.runtime.learner.Learner`.
        counters: callable returning the actors' counters, ``[num_actors, NUM_COUNTERS]``.
    """

    def __init__(self, table: Any, learner: Any, counters: Any):
        self.table = table
        self.learner = learner
        self.counters = counters
        self.start = time.monotonic()
        self._last = self._snapshot()

    def _snapshot(self) -> dict[str, float]:
        info = self.table.info()
        c = self.counters()
        return {
            "t": time.monotonic(),
            "env_steps": float(c[:, ENV_STEPS].sum()),
            "blocked_s": float(c[:, BLOCKED_S].sum()),
            "episodes": float(c[:, EPISODES].sum()),
            "return_sum": float(c[:, RETURN_SUM].sum()),
            "updates": float(self.learner.updates),
            "wait_s": float(self.learner.wait_s),
            "inserts": float(info.inserts),
            "samples": float(info.samples),
            "size": float(info.size),
            "syncs": float(c[:, SYNCS].sum()),
            "actors": float(max(1, len(c))),
        }

    def row(self) -> dict[str, Any]:
        """The row for the interval since the previous call."""
        now, last = self._snapshot(), self._last
        self._last = now
        dt = max(now["t"] - last["t"], 1e-9)
        ages = self.learner.take_ages()
        lags = self.learner.updates_behind(self.counters()[:, VERSION])
        episodes = now["episodes"] - last["episodes"]
        return {
            "env_steps": int(now["env_steps"]),
            "wall_s": round(now["t"] - self.start, 3),
            "env_steps_per_s": (now["env_steps"] - last["env_steps"]) / dt,
            "updates": int(now["updates"]),
            "updates_per_s": (now["updates"] - last["updates"]) / dt,
            "samples_per_insert": _ratio(
                now["samples"] - last["samples"], now["inserts"] - last["inserts"]
            ),
            "samples_per_insert_total": _ratio(now["samples"], now["inserts"]),
            "items_inserted": int(now["inserts"]),
            "items_sampled": int(now["samples"]),
            "learner_wait_frac": min(1.0, (now["wait_s"] - last["wait_s"]) / dt),
            "actor_blocked_frac": min(
                1.0, (now["blocked_s"] - last["blocked_s"]) / (dt * now["actors"])
            ),
            "weight_syncs": int(now["syncs"]),
            "weight_version": self.learner.version,
            "policy_lag_min": float(lags.min()) if lags.size else float("nan"),
            "policy_lag_mean": float(lags.mean()) if lags.size else float("nan"),
            "policy_lag_max": float(lags.max()) if lags.size else float("nan"),
            "sample_age_min": float(ages.min()) if ages.size else float("nan"),
            "sample_age_mean": float(ages.mean()) if ages.size else float("nan"),
            "sample_age_max": float(ages.max()) if ages.size else float("nan"),
            "table_size": int(now["size"]),
            "episodes": int(now["episodes"]),
            "train_return": _ratio(now["return_sum"] - last["return_sum"], episodes),
        }


class StatsSinks:
    """Where rows go: a progress bar, ``out_dir/metrics.csv`` and TensorBoard (when installed)."""

    def __init__(
        self, total_env_steps: int, progress: bool, out_dir: str | os.PathLike[str] | None
    ):
        self._bar = None
        self._print = False
        self._last_eval: float | None = None
        if progress:
            if importlib.util.find_spec("tqdm") is not None:
                from tqdm import tqdm

                self._bar = tqdm(total=total_env_steps, unit="step", dynamic_ncols=True)
            else:
                self._print = True
        self._file: Any = None
        self._csv: csv.DictWriter | None = None
        self._columns: list[str] = list(COLUMNS)
        self._rows: list[dict[str, Any]] = []
        self._tb = None
        self.out_dir = out_dir
        if out_dir is not None:
            os.makedirs(out_dir, exist_ok=True)
            if importlib.util.find_spec("tensorboard") is not None:
                try:
                    from torch.utils.tensorboard import SummaryWriter

                    self._tb = SummaryWriter(os.path.join(out_dir, "tensorboard"))
                except ImportError:
                    self._tb = None

    def write(self, row: dict[str, Any]) -> None:
        """Show and record one row."""
        value = row.get("eval_return")
        if isinstance(value, (int, float)) and np.isfinite(value):
            self._last_eval = float(value)
        shown = {**row, "eval_return": self._last_eval}  # the last evaluation stays shown
        if self._bar is not None:
            self._bar.n = min(row["env_steps"], self._bar.total)
            self._bar.set_postfix_str(short(shown), refresh=False)
            self._bar.refresh()
        elif self._print:
            print(f"steps {row['env_steps']:>9d} {row['env_steps_per_s']:.0f} steps/s "
                  f"{short(shown)}", flush=True)
        if self.out_dir is not None:
            self._rows.append(row)
            if self._csv is None or any(k not in self._columns for k in row):
                self._open_csv()  # a column appeared: the file is written again with it
            else:
                assert self._csv is not None and self._file is not None
                self._csv.writerow(row)
            assert self._file is not None
            self._file.flush()
        if self._tb is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and np.isfinite(value) and key != "env_steps":
                    self._tb.add_scalar(key, value, row["env_steps"])

    def _open_csv(self) -> None:
        """(Re)write ``metrics.csv`` with every column any row has had so far."""
        for row in self._rows:
            self._columns += [k for k in row if k not in self._columns]
        if self._file is not None:
            self._file.close()
        path = os.path.join(self.out_dir or ".", "metrics.csv")
        self._file = open(path, "w", newline="")  # noqa: SIM115 - kept open for rows
        self._csv = csv.DictWriter(self._file, fieldnames=self._columns, restval="")
        self._csv.writeheader()
        self._csv.writerows(self._rows)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def short(row: dict[str, Any]) -> str:
    """The figures a progress bar shows besides env steps: updates/s, ratio, lag, returns."""
    parts = [f"{row['updates_per_s']:.0f} upd/s"]
    for key, name, digits in (
        ("samples_per_insert_total", "spi", 1),  # (none before the first insert)
        ("policy_lag_mean", "lag", 0),
        ("eval_return", "eval", 0),
        ("train_return", "ret", 0),
    ):
        value = row.get(key)
        if isinstance(value, (int, float)) and np.isfinite(value):
            parts.append(f"{name} {value:.{digits}f}")
    return " ".join(parts)
