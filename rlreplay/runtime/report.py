"""Reporting helpers for the learning examples: evaluate, summarize, write the outputs.

:func:`summarize` turns a run's stats rows into ``summary.json`` keys
(``final_eval_return``, ``best_eval_return``, ``steps_to_target``,
``samples_per_insert_*``, ``policy_lag_mean``, ``sample_age_mean``).

Example::

    rows = [{"env_steps": 5000, "wall_s": 6.0, "eval_return": 480.0}]
    summary = summarize(rows, target=475.0, samples_per_insert_target=16.0)
    write_outputs("runs/dqn", rows, summary)   # runs/dqn/summary.json, learning_curve.png
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.errors import InvalidArgumentError, check_count, describe
from rlreplay.runtime.evaluator import EvaluatorProcess

__all__ = ["Evaluations", "evaluate", "summarize", "write_outputs"]

logger = logging.getLogger(__name__)

_warned_no_matplotlib = False


def evaluate(
    make_env_single: Callable[[int], Any],
    act: Callable[[np.ndarray], Any],
    episodes: int = 10,
    seed: int = 10_000,
    max_steps_per_episode: int = 100_000,
) -> float:
    """Mean undiscounted return of ``act`` over ``episodes`` episodes of a fresh single env.

    Args:
        make_env_single: builds one (not vectorized) gymnasium env from a seed.
        act: maps one observation to one action (greedy).
        episodes: number of episodes, at least 1.
        seed: seed of the first episode's reset; episode ``e`` uses ``seed + e``.
        max_steps_per_episode: an episode is cut after this many steps.

    Returns:
        The mean return over the episodes, a float.

    Raises:
        InvalidArgumentError: for a non-callable ``make_env_single`` or ``act``, or a bad
            ``episodes``, ``max_steps_per_episode`` or ``seed``.
    """
    for name, fn in (("make_env_single", make_env_single), ("act", act)):
        if not callable(fn):
            raise InvalidArgumentError(
                f"evaluate({name}={describe(fn)}): expected a callable; pass a function "
                + ("seed -> gymnasium env" if name == "make_env_single" else "obs -> action")
            )
    for name, value in (("episodes", episodes), ("max_steps_per_episode", max_steps_per_episode)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidArgumentError(f"evaluate({name}={describe(value)}): expected an int >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise InvalidArgumentError(f"evaluate(seed={describe(seed)}): expected an int")
    env = make_env_single(int(seed))
    try:
        returns = np.zeros(int(episodes), dtype=np.float64)
        for episode in range(int(episodes)):
            obs, _ = env.reset(seed=int(seed) + episode)
            for _ in range(int(max_steps_per_episode)):
                obs, reward, terminated, truncated, _ = env.step(act(obs))
                returns[episode] += float(reward)
                if terminated or truncated:
                    break
    finally:
        env.close()
    return float(returns.mean())


class Evaluations:
    """An ``on_stats`` hook for :func:`rlreplay.runtime.run` that evaluates the newest weights.

    Evaluates every ``every`` env steps and on the final row, in an
    :class:`~rlreplay.runtime.evaluator.EvaluatorProcess`; the hook blocks until each score
    arrives. Pair it with ``RuntimeConfig(stats_every_steps=every)``; close it when done.

    Args:
        evaluate_params: ``params -> mean return``, picklable (defined at module level).
        every: env steps between evaluations (>= 1).
        timeout_s: seconds one evaluation may take.

    Raises:
        InvalidArgumentError: for a non-callable or unpicklable ``evaluate_params``, or a bad
            ``every`` or ``timeout_s``.
    """

    def __init__(
        self,
        evaluate_params: Callable[[Mapping[str, np.ndarray]], float],
        every: int,
        timeout_s: float = 600.0,
    ):
        self.every = check_count(every, "every")
        self.evaluator = EvaluatorProcess(evaluate_params, timeout_s)
        self.next_at = every

    def __call__(self, row: Mapping[str, Any], weights: Any) -> dict[str, Any]:
        steps = row["env_steps"]
        if weights is None or not (row.get("final") or steps >= self.next_at):
            return {"eval_return": None, "eval_version": None}
        while self.next_at <= steps:
            self.next_at += self.every
        value = self.evaluator(weights.params)
        return {"eval_return": value, "eval_version": weights.version}

    def close(self) -> None:
        """Stop the evaluator process."""
        self.evaluator.close()

    def __enter__(self) -> Evaluations:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _number(value: Any) -> float | None:
    """``value`` as a finite float, else ``None``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def summarize(
    rows: Sequence[Mapping[str, Any]],
    target: float,
    samples_per_insert_target: float | None,
) -> dict[str, Any]:
    """The summary of one run from its stats rows (keys: see the module docstring).

    Args:
        rows: the run's stats rows (``RunResult.rows``), at least one, each with ``env_steps``.
        target: the example's return target (CartPole: 475).
        samples_per_insert_target: the ratio asked for; ``None`` for an on-policy queue.

    Returns:
        The summary keys plus ``env_steps, wall_s, target, num_evals``; missing measurements
        are ``None``.

    Raises:
        InvalidArgumentError: for empty ``rows``, a row without ``env_steps``, a non-finite
            ``target``, or a ``samples_per_insert_target`` neither ``None`` nor positive.
    """
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or len(rows) == 0:
        raise InvalidArgumentError(
            f"summarize(rows={describe(rows)}): expected a non-empty list of stats rows "
            "(RunResult.rows); a run always produces at least its final row"
        )
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping) or _number(row.get("env_steps")) is None:
            raise InvalidArgumentError(
                f"summarize(rows[{index}]={describe(row)}): expected a dict with a numeric "
                "'env_steps' (a stats row from rlreplay.runtime.run)"
            )
    if _number(target) is None:
        raise InvalidArgumentError(
            f"summarize(target={describe(target)}): expected a finite number (the return "
            "an evaluation must reach)"
        )
    ratio = _number(samples_per_insert_target)
    if samples_per_insert_target is not None and (ratio is None or ratio <= 0):
        raise InvalidArgumentError(
            f"summarize(samples_per_insert_target={describe(samples_per_insert_target)}): "
            "expected a positive number, or None for a run without a ratio"
        )
    evals = [
        (int(row["env_steps"]), _number(row.get("eval_return")))
        for row in rows
        if _number(row.get("eval_return")) is not None
    ]
    reached = [steps for steps, value in evals if value >= float(target)]
    def mean_of(column: str) -> float | None:
        values = [v for v in (_number(row.get(column)) for row in rows) if v is not None]
        return float(np.mean(values)) if values else None

    last = rows[-1]
    return {
        "env_steps": int(last["env_steps"]),
        "wall_s": _number(last.get("wall_s")),
        "final_eval_return": evals[-1][1] if evals else None,
        "best_eval_return": max(value for _, value in evals) if evals else None,
        "steps_to_target": reached[0] if reached else None,
        "target": float(target),
        "samples_per_insert_target": ratio,
        "samples_per_insert_observed": _number(last.get("samples_per_insert_total")),
        "policy_lag_mean": mean_of("policy_lag_mean"),
        "sample_age_mean": mean_of("sample_age_mean"),
        "num_evals": len(evals),
    }


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars made Python numbers and NaN/inf made ``None`` (JSON)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(float(value)) else None
    return value


def write_outputs(
    out_dir: str | os.PathLike[str],
    rows: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    title: str = "evaluation return during training",
) -> dict[str, Path]:
    """Write ``out_dir/summary.json`` and, with matplotlib, ``learning_curve.png``.

    Args:
        out_dir: the output folder, created if missing.
        rows: the run's stats rows (for the curve).
        summary: the dict to write as JSON (NaN and infinities become ``null``).

    Returns:
        ``{"summary": path}`` plus ``{"learning_curve": path}`` when the PNG was written.

    Raises:
        InvalidArgumentError: if ``summary`` is not a mapping or ``rows`` not a sequence of
            mappings (nothing is written).
    """
    if not isinstance(summary, Mapping):
        raise InvalidArgumentError(
            f"write_outputs(summary={describe(summary)}): expected a dict (from summarize())"
        )
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise InvalidArgumentError(
            f"write_outputs(rows={describe(rows)}): expected a list of stats rows"
        )
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise InvalidArgumentError(
                f"write_outputs(rows[{index}]={describe(row)}): expected a dict (a stats row)"
            )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"summary": out / "summary.json"}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(_plain(summary), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, paths["summary"])
    curve = _plot_learning_curve(out / "learning_curve.png", rows, summary, title)
    if curve is not None:
        paths["learning_curve"] = curve
    return paths


def _plot_learning_curve(
    path: Path, rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], title: str
) -> Path | None:
    """Plot eval return against env steps into ``path``; ``None`` without matplotlib."""
    global _warned_no_matplotlib
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if not _warned_no_matplotlib:
            _warned_no_matplotlib = True
            logger.warning(
                "matplotlib is not installed: learning_curve.png is not written "
                "(pip install matplotlib, or the 'examples' extra)"
            )
        return None
    points = [
        (float(row["env_steps"]), _number(row.get("eval_return")))
        for row in rows
        if _number(row.get("env_steps")) is not None and _number(row.get("eval_return")) is not None
    ]
    fig, ax = plt.subplots(figsize=(6, 4))
    try:
        if points:
            steps, returns = zip(*points)
            ax.plot(steps, returns, marker="o", label="eval return (greedy)")
        target = _number(summary.get("target"))
        if target is not None:
            ax.axhline(target, linestyle="--", color="gray", label=f"target {target:g}")
        shown = [r for _, r in points] + ([] if target is None else [target])
        if shown and min(shown) >= 0:  # the axis reaches 0: from it, or up to it
            ax.set_ylim(bottom=0.0)
        elif shown and max(shown) <= 0:
            ax.set_ylim(top=0.0)
        ax.set_title(title)
        ax.set_xlabel("env steps")
        ax.set_ylabel("mean evaluation return")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
