"""examples/apex_dqn.py: the epsilon ladder, and a smoke run with actor processes."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("zmq")

from rlreplay import InvalidArgumentError

# Imported as installed (rlreplay.examples), so actor processes can unpickle its policy.
from rlreplay.examples import apex_dqn as apex


def test_ladder_spans_every_env_of_every_actor_from_base_down():
    total = 8
    eps = np.concatenate([apex.epsilon_ladder(a * 4, 4, total, 0.4, 7.0) for a in range(2)])
    assert eps[0] == pytest.approx(0.4)
    assert eps[-1] == pytest.approx(0.4 ** 8)
    assert np.all(np.diff(eps) < 0)


def test_each_actor_policy_takes_its_own_rungs():
    args = apex.ApexArgs(num_envs=3, num_actors=2)
    first = apex.LadderPolicy(0, 2, 1, args)
    second = apex.LadderPolicy(1, 2, 2, args)
    assert first.epsilons[0] == pytest.approx(0.4)
    assert second.epsilons[-1] == pytest.approx(0.4 ** 8)
    assert set(first.epsilons).isdisjoint(second.epsilons)


def test_most_exploring_env_explores_at_its_rate_and_the_least_acts_greedily():
    args = apex.ApexArgs(num_envs=2, num_actors=1, eps_base=0.5, eps_alpha=7.0, hidden=8)
    policy = apex.LadderPolicy(0, 1, 0, args)
    learner = apex.dqn.DqnLearner(apex.dqn.Args(hidden=8))
    policy.set_params(learner.params())
    obs = np.zeros((2, 4), np.float32)
    greedy = int(apex.dqn.q_values(policy.params, obs[:1]).argmax())
    actions = np.array([policy(obs, 0) for _ in range(4000)])
    off = (actions != greedy).mean(axis=0)
    assert off[0] == pytest.approx(0.25, abs=0.04)  # explores with 0.5, random half wrong
    assert off[1] < 0.01  # 0.5 ** 8 / 2


@pytest.mark.parametrize(("flags", "named"), [
    (["--eps-base", "1.5"], "--eps-base"),
    (["--eps-alpha", "-1"], "--eps-alpha"),
    (["--scaling", "0"], "--scaling"),
])
def test_bad_flags_are_refused_naming_the_flag(flags, named):
    with pytest.raises(InvalidArgumentError, match=named):
        apex.main(flags)


def test_smoke_run_with_two_actor_processes_writes_the_outputs(tmp_path):
    out = tmp_path / "run"
    summary = apex.main(["--total-steps", "800", "--learning-starts", "200", "--hidden", "16",
                         "--no-progress", "--eval-episodes", "1", "--out", str(out)])
    assert summary["env_steps"] == 800 and summary["backend"] == "processes"
    assert summary["updates"] > 0
    assert json.loads((out / "summary.json").read_text())["env_steps"] == 800
    assert (out / "metrics.csv").exists()



def test_help_describes_ape_x_and_its_scaling_flag(capsys):
    with pytest.raises(SystemExit):
        apex.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Ape-X DQN on CartPole-v1" in text
    assert "DQN on CartPole-v1 with prioritized replay" not in text  # dqn_cartpole's line
    assert "--scaling N [N ...]" in text
    assert "--eps-base EPS_BASE" in text
