"""A DQN fed through the n-step adder and a prioritized table learns CartPole-v1."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from dqn_check import DqnConfig, random_policy_return, train_dqn


def test_random_policy_baseline_is_about_22():
    assert 15 < random_policy_return() < 30


def test_short_dqn_clearly_beats_a_random_policy():
    result = train_dqn(DqnConfig(env_steps=24_000, seed=0))
    random_return = random_policy_return()
    assert result["eval_return"] > max(100.0, 3 * random_return), result


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_longer_dqn_nearly_solves_cartpole(seed):
    result = train_dqn(DqnConfig(env_steps=60_000, eps_end_step=15_000, seed=seed))
    assert result["eval_return"] > 300.0, result
