"""The examples' reporting helpers: evaluation, the run summary and the output files."""

from __future__ import annotations

import json
import logging
import math
import sys

import numpy as np
import pytest

from rlreplay.errors import InvalidArgumentError
from rlreplay.runtime import report


class LineEnv:
    """Episode of ``3 + seed % 5`` steps (reward 1 each, doubled for action 1); counts closes."""

    def __init__(self, endless: bool = False):
        self.endless = endless
        self.resets: list[int] = []
        self.closed = 0

    def reset(self, *, seed=None, options=None):
        self.resets.append(seed)
        self.t, self.length = 0, 3 + seed % 5
        return np.array([seed, 0.0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length and not self.endless
        obs = np.array([self.resets[-1], self.t], dtype=np.float32)
        return obs, 1.0 + float(action), done, False, {}

    def close(self):
        self.closed += 1


def test_evaluate_averages_returns_over_episodes_seeded_from_seed():
    env = LineEnv()
    mean = report.evaluate(lambda seed: env, lambda obs: 0, episodes=4, seed=10)
    assert env.resets == [10, 11, 12, 13]
    assert mean == pytest.approx(np.mean([3 + s % 5 for s in (10, 11, 12, 13)]))
    assert env.closed == 1


def test_evaluate_passes_each_observation_and_uses_the_action():
    env, seen = LineEnv(), []

    def act(obs):
        seen.append(obs.copy())
        return 1

    assert report.evaluate(lambda seed: env, act, episodes=1, seed=0) == 6.0
    assert [tuple(o) for o in seen] == [(0.0, 0.0), (0.0, 1.0), (0.0, 2.0)]


def test_evaluate_cuts_an_endless_episode_at_max_steps_per_episode():
    env = LineEnv(endless=True)
    assert report.evaluate(lambda s: env, lambda o: 0, episodes=2, max_steps_per_episode=7) == 7.0


def test_evaluate_closes_the_env_when_the_policy_raises():
    env = LineEnv()

    def act(obs):
        raise RuntimeError("policy failed")

    with pytest.raises(RuntimeError, match="policy failed"):
        report.evaluate(lambda seed: env, act)
    assert env.closed == 1


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"make_env_single": "CartPole-v1"}, "make_env_single"),
        ({"act": None}, "act"),
        ({"episodes": 0}, "episodes"),
        ({"episodes": 2.5}, "episodes"),
        ({"episodes": True}, "episodes"),
        ({"max_steps_per_episode": -1}, "max_steps_per_episode"),
        ({"seed": "1"}, "seed"),
    ],
)
def test_evaluate_rejects_bad_arguments_before_building_the_env(kwargs, name):
    built = []
    args = {"make_env_single": lambda seed: built.append(seed) or LineEnv(), "act": lambda o: 0}
    args.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=name):
        report.evaluate(**args)
    assert built == []


ROWS = [
    {"env_steps": 1000, "wall_s": 1.0, "policy_lag_mean": 2.0, "samples_per_insert_total": 0.0},
    {"env_steps": 5000, "wall_s": 4.0, "eval_return": 120.0, "policy_lag_mean": 4.0},
    {"env_steps": 7000, "wall_s": 5.0, "eval_return": None, "policy_lag_mean": float("nan")},
    {"env_steps": 10000, "wall_s": 8.0, "eval_return": 480.0, "policy_lag_mean": 3.0},
    {"env_steps": 15000, "wall_s": 11.0, "eval_return": float("nan")},
    {
        "env_steps": 20000,
        "wall_s": 14.5,
        "eval_return": np.float64(470.0),
        "samples_per_insert_total": 15.5,
    },
]


def test_summarize_reads_final_best_and_first_step_reaching_the_target():
    summary = report.summarize(ROWS, target=475, samples_per_insert_target=16)
    assert summary == {
        "env_steps": 20000,
        "wall_s": 14.5,
        "final_eval_return": 470.0,
        "best_eval_return": 480.0,
        "steps_to_target": 10000,
        "target": 475.0,
        "samples_per_insert_target": 16.0,
        "samples_per_insert_observed": 15.5,
        "policy_lag_mean": 3.0,
        "sample_age_mean": None,
        "num_evals": 3,
    }


@pytest.mark.parametrize(
    "rows, target, expected",
    [
        (ROWS, 500.0, {"steps_to_target": None, "best_eval_return": 480.0}),
        (ROWS, 100.0, {"steps_to_target": 5000}),
        (ROWS[:1], 475.0, {"final_eval_return": None, "best_eval_return": None, "num_evals": 0}),
        (ROWS[2:3], 475.0, {"policy_lag_mean": None, "samples_per_insert_observed": None}),
    ],
    ids=["target-never-reached", "first-eval-reaches", "no-evals", "no-lag-no-ratio"],
)
def test_summarize_leaves_missing_measurements_none(rows, target, expected):
    summary = report.summarize(rows, target=target, samples_per_insert_target=None)
    assert {key: summary[key] for key in expected} == expected
    assert summary["samples_per_insert_target"] is None


@pytest.mark.parametrize(
    "rows, target, ratio, name",
    [
        ([], 475.0, 8.0, "rows"),
        ("rows", 475.0, 8.0, "rows"),
        ([{"wall_s": 1.0}], 475.0, 8.0, r"rows\[0\]"),
        ([{"env_steps": 1}, 3], 475.0, 8.0, r"rows\[1\]"),
        (ROWS, float("nan"), 8.0, "target"),
        (ROWS, None, 8.0, "target"),
        (ROWS, 475.0, 0.0, "samples_per_insert_target"),
        (ROWS, 475.0, "8", "samples_per_insert_target"),
    ],
)
def test_summarize_rejects_bad_arguments(rows, target, ratio, name):
    with pytest.raises(InvalidArgumentError, match=name):
        report.summarize(rows, target=target, samples_per_insert_target=ratio)


def test_write_outputs_writes_summary_json_with_nan_as_null(tmp_path):
    summary = dict(report.summarize(ROWS, 475.0, 16.0), extra=np.float32("nan"), n=np.int64(3))
    paths = report.write_outputs(tmp_path / "run" / "a", ROWS, summary)
    loaded = json.loads(paths["summary"].read_text())
    assert paths["summary"] == tmp_path / "run" / "a" / "summary.json"
    assert loaded["extra"] is None and loaded["n"] == 3
    assert loaded["steps_to_target"] == 10000 and loaded["final_eval_return"] == 470.0
    assert not (tmp_path / "run" / "a" / "summary.json.tmp").exists()


def test_write_outputs_draws_the_learning_curve_png(tmp_path):
    pytest.importorskip("matplotlib")
    paths = report.write_outputs(tmp_path, ROWS, report.summarize(ROWS, 475.0, 16.0))
    assert paths["learning_curve"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_outputs_without_matplotlib_skips_the_png_and_logs_once(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    monkeypatch.setattr(report, "_warned_no_matplotlib", False)
    summary = report.summarize(ROWS, 475.0, 16.0)
    with caplog.at_level(logging.WARNING, logger=report.__name__):
        first = report.write_outputs(tmp_path, ROWS, summary)
        second = report.write_outputs(tmp_path, ROWS, summary)
    assert "learning_curve" not in first and "learning_curve" not in second
    assert not (tmp_path / "learning_curve.png").exists()
    assert (tmp_path / "summary.json").exists()
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "matplotlib" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    "rows, summary, name",
    [
        (ROWS, [("a", 1)], "summary"),
        ("rows", {}, "rows"),
        ([ROWS[0], 5], {}, r"rows\[1\]"),
    ],
)
def test_write_outputs_rejects_bad_arguments_and_writes_nothing(tmp_path, rows, summary, name):
    with pytest.raises(InvalidArgumentError, match=name):
        report.write_outputs(tmp_path / "out", rows, summary)
    assert not (tmp_path / "out").exists()


def test_summary_values_are_json_numbers_or_null():
    summary = report.summarize(ROWS, 475.0, 16.0)
    for key, value in summary.items():
        assert value is None or isinstance(value, (int, float)), key
        assert value is None or math.isfinite(value), key


CURVES = {
    "positive_returns": ([20.0, 200.0, 470.0], 475.0),
    "negative_returns": ([-1400.0, -600.0, -150.0], -200.0),
    "no_target": ([5.0, 9.0], None),
}


@pytest.mark.parametrize("case", CURVES)
def test_the_learning_curve_has_its_title_and_a_y_axis_that_reaches_0(tmp_path, monkeypatch, case):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    seen: dict = {}
    savefig = Figure.savefig

    def recording(fig, *args, **kwargs):
        ax = fig.axes[0]
        seen.update(title=ax.get_title(), ylim=ax.get_ylim())
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording)
    returns, target = CURVES[case]
    rows = [{"env_steps": 1000 * (i + 1), "eval_return": r} for i, r in enumerate(returns)]
    report.write_outputs(tmp_path, rows, {"target": target}, title="SAC on Pendulum-v1")
    low, high = seen["ylim"]
    assert seen["title"] == "SAC on Pendulum-v1"
    assert 0.0 in (low, high) and low < high, seen
    assert low <= min(returns) and high >= max(returns)


def test_the_progress_bar_shows_the_figures_it_has():
    from rlreplay.runtime.stats import short

    row = {"updates_per_s": 50.0, "samples_per_insert_total": 7.9, "policy_lag_mean": 3.0}
    assert short(row) == "50 upd/s spi 7.9 lag 3"
    row.update(policy_lag_mean=float("nan"), eval_return=300.0)  # no batch since the last row
    assert short(row) == "50 upd/s spi 7.9 eval 300"
    row.update(samples_per_insert_total=float("nan"))  # nothing inserted yet
    assert short(row) == "50 upd/s eval 300"
