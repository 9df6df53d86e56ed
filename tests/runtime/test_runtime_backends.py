"""The runtime on each backend: steps taken, ratio held, weights synced, lag measured."""

from __future__ import annotations

import csv

import numpy as np
import pytest

pytest.importorskip("gymnasium")

import parts

import rlreplay as rr
import rlreplay.runtime as rt

TOTAL = 3_000


def config(backend: str, **kwargs) -> rt.RuntimeConfig:
    kwargs.setdefault("updates_per_env_step", 0.25)
    kwargs.setdefault("batch_size", 16)
    kwargs.setdefault("min_size_to_sample", 200)
    kwargs.setdefault("weight_sync_period", 50)
    kwargs.setdefault("stats_every_s", 0.2)
    kwargs.setdefault("progress", False)
    kwargs.setdefault("timeout_s", 20.0)
    return rt.RuntimeConfig(backend=backend, **kwargs)


def train(backend: str, learner=None, total=TOTAL, max_updates=None, **kwargs) -> rt.RunResult:
    return rt.run(
        config(backend, **kwargs),
        make_env=parts.make_env,
        make_policy=parts.RandomPolicy,
        learner=learner or parts.CountingLearner(),
        replay=parts.replay(sampler=rr.Prioritized(0.6)),
        total_env_steps=total,
        max_updates=max_updates,
    )


@pytest.mark.parametrize("backend", ["inline", "threads"])
def test_run_takes_the_env_steps_and_holds_the_ratio(backend, tmp_path):
    learner = parts.CountingLearner()
    result = train(backend, learner, num_actors=2, out_dir=str(tmp_path))
    s = result.summary
    assert s["env_steps"] == TOTAL
    assert s["updates"] == learner.updates > 0
    target = s["samples_per_insert_target"]
    assert target == 0.25 * 16
    # The limiter keeps samples within error_buffer of target * (inserts - min_size).
    expected = target * (s["items_inserted"] - 200)
    assert abs(s["items_sampled"] - expected) <= config(backend).limiter_buffer() + 16
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and set(rt.stats.COLUMNS) <= set(rows[0])
    assert int(rows[-1]["env_steps"]) == TOTAL


@pytest.mark.parametrize("backend", ["inline", "threads"])
def test_every_sampled_step_names_an_already_published_version(backend):
    learner = parts.CountingLearner()
    result = train(backend, learner, publish_every=5)
    versions = np.concatenate(learner.versions)
    assert versions.min() >= 0
    assert versions.max() <= result.summary["weight_version"]
    assert result.summary["sample_age_mean"] >= 0


def test_inline_runs_with_one_seed_are_identical():
    first, second = parts.CountingLearner(), parts.CountingLearner()
    train("inline", first, seed=3)
    train("inline", second, seed=3)
    other = parts.CountingLearner()
    train("inline", other, seed=4)
    assert first.digests == second.digests and len(first.digests) > 50
    assert first.digests != other.digests


@pytest.mark.parametrize("backend", ["inline", "threads"])
def test_zeroed_weights_reach_every_actor_within_one_sync_period(backend):
    period = 40
    learner = parts.CountingLearner(zero_at=60)
    train(backend, learner, num_actors=2, weight_sync_period=period, total=4_000)
    assert learner.zeroed_steps is not None
    for index, before in learner.zeroed_steps.items():
        seen = parts.SEEN[index]
        first_zero = next(steps for steps, w in seen if w == 0.0)
        # params() is read just before publication: one period to the next sync, one
        # more if a sync fell between reading and publishing.
        assert first_zero <= before + 2 * period + parts.NUM_ENVS
        assert all(w == 0.0 for steps, w in seen if steps > first_zero)


def test_on_stats_extends_rows_and_sees_published_weights():
    seen = []

    def on_stats(row, weights):
        seen.append(weights.version)
        return {"eval_return": float(weights.params["w"][0])}

    result = rt.run(
        config("threads"), make_env=parts.make_env, make_policy=parts.RandomPolicy,
        learner=parts.CountingLearner(), replay=parts.replay(), total_env_steps=TOTAL,
        on_stats=on_stats,
    )
    assert seen and all(v >= 0 for v in seen)
    assert all("eval_return" in row for row in result.rows)


def test_max_updates_stops_the_run():
    learner = parts.CountingLearner()
    result = train("threads", learner, total=200_000, max_updates=30)
    assert learner.updates == 30
    assert result.summary["env_steps"] < 200_000


@pytest.mark.parametrize("updates_per_env_step", [0.125, 1.0])
def test_inline_alternates_within_one_vector_step_of_many_envs(updates_per_env_step):
    # One add() of 16 envs can hand over 16 chunks of items, more than the default buffer
    # admits at once; the refused rest waits in the adder while the learner catches up,
    # and a drain that hands over only part of it is progress, not a deadlock.
    learner = parts.CountingLearner()
    result = rt.run(
        config("inline", updates_per_env_step=updates_per_env_step, batch_size=64,
               min_size_to_sample=1_000),
        make_env=parts.make_env16, make_policy=parts.RandomPolicy, learner=learner,
        replay=parts.replay(max_size=20_000), total_env_steps=40_000,
    )
    s = result.summary
    assert s["env_steps"] == 40_000
    ratio = updates_per_env_step * 64
    expected = ratio * (s["items_inserted"] - 1_000)
    buffer = config("inline", updates_per_env_step=updates_per_env_step,
                    batch_size=64).limiter_buffer()
    assert abs(s["items_sampled"] - expected) <= buffer + 64


def test_inline_rows_land_exactly_on_every_multiple_of_stats_every_steps():
    result = train("inline", stats_every_s=3600.0, stats_every_steps=500)
    steps = [row["env_steps"] for row in result.rows]
    assert steps == [500 * k for k in range(1, TOTAL // 500 + 1)] + [TOTAL]
    assert [row["final"] for row in result.rows] == [False] * (len(steps) - 1) + [True]


def test_a_column_on_stats_adds_later_reaches_metrics_csv(tmp_path):
    def on_stats(row, weights):
        return {"eval_return": 1.5} if row["env_steps"] >= 1_500 else None

    rt.run(
        config("inline", stats_every_s=3600.0, stats_every_steps=500, out_dir=str(tmp_path)),
        make_env=parts.make_env, make_policy=parts.RandomPolicy,
        learner=parts.CountingLearner(), replay=parts.replay(), total_env_steps=TOTAL,
        on_stats=on_stats,
    )
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["eval_return"] for r in rows] == ["", "", "1.5", "1.5", "1.5", "1.5", "1.5"]


def test_policy_lag_counts_the_updates_made_since_the_actors_weights():
    """Weight staleness per row: learner updates minus the updates of the weights the
    actors act with; an actor pulling weights ten times less often acts on older ones."""

    def mean_lag(sync_period: int) -> float:
        result = train("inline", stats_every_s=1e-3, stats_every_steps=100,
                       weight_sync_period=sync_period, publish_every=1)
        lags = [r["policy_lag_mean"] for r in result.rows if np.isfinite(r["policy_lag_mean"])]
        assert lags and min(lags) >= 0
        return float(np.mean(lags))

    often, seldom = mean_lag(8), mean_lag(400)
    # Inline, updates per env step are 0.25: a 400-step period averages ~50 updates behind.
    assert often < 5 < 20 < seldom
