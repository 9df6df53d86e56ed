"""examples/dqn_cartpole.py: the numpy acting policy agrees with the torch Q network, the
double-DQN target and priorities, the schedules, a smoke run on every backend (the files and
summary keys) and a short seeded run that fails when learning breaks."""

from __future__ import annotations

import csv
import importlib
import importlib.util
import io
import json
import math
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from batches import uniform_sample  # noqa: E402

from rlreplay import InvalidArgumentError, Sample  # noqa: E402

# The examples install as rlreplay.examples, which actor processes import too.
dqn = importlib.import_module("rlreplay.examples.dqn_cartpole")

SUMMARY_KEYS = {
    "env_steps",
    "wall_s",
    "final_eval_return",
    "best_eval_return",
    "steps_to_target",
    "samples_per_insert_target",
    "samples_per_insert_observed",
    "policy_lag_mean",
    "updates",
    "backend",
}


def small_args(**overrides) -> dqn.Args:
    return dqn.Args(**{"seed": 3, "hidden": 16, "batch_size": 8, **overrides})


def fake_batch(rng: np.random.Generator, size: int, discount: float = 0.97) -> Sample:
    """A batch shaped as the example's n-step transition table serves it."""
    data = {
        "obs": rng.standard_normal((size, dqn.OBS_DIM)).astype(np.float32),
        "action": rng.integers(dqn.NUM_ACTIONS, size=size).astype(np.int64),
        "reward": rng.standard_normal(size).astype(np.float32),
        "discount": np.full(size, discount, np.float32),
        "next_obs": rng.standard_normal((size, dqn.OBS_DIM)).astype(np.float32),
    }
    return uniform_sample(data)


# ---------------------------------------------------------------------------- acting
def test_numpy_q_values_are_the_torch_networks_on_the_published_weights():
    learner = dqn.DqnLearner(small_args())
    obs = np.random.default_rng(0).standard_normal((5, dqn.OBS_DIM)).astype(np.float32)
    with torch.no_grad():
        expected = learner.q(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(dqn.q_values(learner.params(), obs), expected, rtol=1e-5, atol=1e-6)


def test_policy_explores_by_the_epsilon_schedule_then_acts_greedily():
    args = small_args(eps_start=1.0, eps_end=0.0, eps_decay_steps=100)
    learner = dqn.DqnLearner(args)
    policy = dqn.QPolicy(0, 1, seed=5, args=args)
    obs = np.random.default_rng(1).standard_normal((256, dqn.OBS_DIM)).astype(np.float32)
    assert policy(obs, 0).shape == (256,)  # no weights yet: random actions
    policy.set_params(learner.params())
    greedy = dqn.q_values(learner.params(), obs).argmax(axis=1)
    assert dqn.epsilon(0, args) == 1.0 and dqn.epsilon(50, args) == pytest.approx(0.5)
    assert dqn.epsilon(10_000, args) == 0.0
    late = policy(obs, 100)
    assert late.dtype == np.int64 and np.array_equal(late, greedy)
    agree_early = np.mean(policy(obs, 0) == greedy)  # epsilon 1: coin flips
    assert 0.3 < agree_early < 0.7


# -------------------------------------------------------------------------- learning
def test_update_returns_td_errors_against_the_double_dqn_target_as_priorities():
    learner = dqn.DqnLearner(small_args(target_update_every=1000))
    with torch.no_grad():  # make the target net differ from the online net
        for p in learner.q_target.parameters():
            p.add_(0.1)
    batch = fake_batch(np.random.default_rng(2), 8)
    data = {k: torch.from_numpy(v) for k, v in batch.data.items()}
    with torch.no_grad():
        best = learner.q(data["next_obs"]).argmax(1, keepdim=True)
        boot = learner.q_target(data["next_obs"]).gather(1, best).squeeze(1)
        target = data["reward"] + data["discount"] * boot
        predicted = learner.q(data["obs"]).gather(1, data["action"][:, None]).squeeze(1)
    expected = (target - predicted).abs().double().numpy() + 1e-3
    priorities = learner.update(batch)
    assert priorities.dtype == np.float64 and priorities.shape == (8,)
    np.testing.assert_allclose(priorities, expected, rtol=1e-5)


def test_terminal_transitions_do_not_bootstrap():
    learner = dqn.DqnLearner(small_args())
    batch = fake_batch(np.random.default_rng(3), 8, discount=0.0)
    obs = torch.from_numpy(batch.data["obs"])
    with torch.no_grad():
        predicted = learner.q(obs).gather(1, torch.from_numpy(batch.data["action"])[:, None])
    expected = np.abs(batch.data["reward"] - predicted.squeeze(1).numpy()) + 1e-3
    np.testing.assert_allclose(learner.update(batch), expected, rtol=1e-5)


def test_target_network_is_copied_every_target_update_every_updates():
    learner = dqn.DqnLearner(small_args(target_update_every=3, target_tau=1.0))
    rng = np.random.default_rng(4)
    initial = [p.detach().clone() for p in learner.q_target.parameters()]
    for _ in range(2):
        learner.update(fake_batch(rng, 8))
    assert all(torch.equal(a, b) for a, b in zip(initial, learner.q_target.parameters()))
    learner.update(fake_batch(rng, 8))
    for online, target in zip(learner.q.parameters(), learner.q_target.parameters()):
        assert torch.equal(online, target)


def test_polyak_target_moves_by_tau_towards_the_online_network_after_each_update():
    learner = dqn.DqnLearner(small_args(target_update_every=1, target_tau=0.25))
    target_before = [p.detach().clone() for p in learner.q_target.parameters()]
    learner.update(fake_batch(np.random.default_rng(7), 8))
    for online, target, target0 in zip(
        learner.q.parameters(), learner.q_target.parameters(), target_before
    ):
        assert not torch.equal(target, target0)
        torch.testing.assert_close(target, target0 + 0.25 * (online.detach() - target0))


def test_learning_rate_decays_linearly_to_zero_over_the_expected_updates():
    args = small_args(total_steps=40, updates_per_env_step=0.25, lr=1e-3)  # 10 updates
    learner = dqn.DqnLearner(args)
    rng = np.random.default_rng(5)
    rates = []
    for _ in range(12):
        learner.update(fake_batch(rng, 8))
        rates.append(learner.optimizer.param_groups[0]["lr"])
    assert rates[0] == pytest.approx(1e-3) and rates[5] == pytest.approx(5e-4)
    assert rates[10:] == [0.0, 0.0]


def test_params_are_copies_that_later_updates_do_not_change():
    learner = dqn.DqnLearner(small_args())
    before = learner.params()
    kept = {k: v.copy() for k, v in before.items()}
    learner.update(fake_batch(np.random.default_rng(6), 8))
    assert all(np.array_equal(before[k], kept[k]) for k in kept)
    assert any(not np.array_equal(learner.params()[k], kept[k]) for k in kept)


# ------------------------------------------------------------------------------ runs
@pytest.mark.parametrize("backend", ["inline", "threads", "processes"])
def test_smoke_run_writes_metrics_summary_and_curve_on_every_backend(backend, tmp_path):
    if backend == "processes":
        pytest.importorskip("zmq")
    flags = f"--backend {backend} --seed 1 --total-steps 400 --out {tmp_path}"
    flags += " --learning-starts 200 --batch-size 16 --hidden 16 --eval-every 300"
    flags += " --eval-episodes 2 --no-progress"
    summary = dqn.main(flags.split())
    assert set(summary) >= SUMMARY_KEYS
    assert summary["env_steps"] == 400 and summary["backend"] == backend
    assert summary["samples_per_insert_target"] == 8.0  # 0.5 updates per step * 16
    assert summary["updates"] > 0 and math.isfinite(summary["final_eval_return"])
    assert json.loads((tmp_path / "summary.json").read_text()) == pytest.approx(summary)
    text = (tmp_path / "metrics.csv").read_text()
    header, *rows = text.splitlines()
    assert {"eval_return", "samples_per_insert", "policy_lag_mean"} <= set(header.split(","))
    assert rows
    last = list(csv.DictReader(io.StringIO(text)))[-1]
    assert last["env_steps"] == "400" and last["eval_return"]  # the end is always evaluated
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "learning_curve.png").stat().st_size > 0


def test_flags_fill_args_and_unknown_flags_are_refused():
    args = dqn.parse_args(["--total-steps", "500", "--no-progress", "--n-step", "2"])
    assert (args.total_steps, args.progress, args.n_step) == (500, False, 2)
    assert dqn.parse_args([]) == dqn.Args()
    with pytest.raises(SystemExit):
        dqn.parse_args(["--total-step", "5"])
    with pytest.raises(SystemExit):
        dqn.parse_args(["--backend", "cluster"])


BAD_FLAGS = {
    "no env steps": (["--total-steps", "0"], "--total-steps=0"),
    "no n-step horizon": (["--n-step", "0"], "--n-step=0"),
    "no evaluation episodes": (["--eval-episodes", "0"], "--eval-episodes=0"),
    "a discount above 1": (["--gamma", "1.5"], "--gamma=1.5"),
    "an epsilon below 0": (["--eps-end=-0.1"], "--eps-end=-0.1"),
    "a negative learning rate": (["--lr=-1e-3"], "--lr=-0.001"),
}


@pytest.mark.parametrize("flags, named", BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_out_of_range_flags_are_refused_naming_the_flag_before_anything_runs(
    flags, named, tmp_path
):
    out = tmp_path / "out"
    with pytest.raises(InvalidArgumentError, match=re.escape(named)):
        dqn.main([*flags, "--no-progress", "--out", str(out)])
    assert not out.exists()


def test_short_seeded_run_learns_well_beyond_a_random_policy():
    """A random policy scores about 22 on CartPole and the untrained network's greedy policy
    91 (the same run with its optimizer steps disabled); this seeded run passes 150 within
    6000 env steps (about 2500 updates). The inline backend makes it exactly reproducible."""
    flags = "--backend inline --seed 0 --total-steps 6000 --eval-every 2000 --no-progress"
    summary = dqn.main([*flags.split(), "--out", ""])
    assert summary["best_eval_return"] > 150.0, summary
