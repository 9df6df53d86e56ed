"""benchmarks/costly_env.py: a costly step spends its CPU time, either way, and leaves the
wrapped env's dynamics, observations and rewards as they were."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gymnasium")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmarks package

from benchmarks.costly_env import COSTS, NativeSpender, make_costly_vec


def rollout(env, steps: int = 30) -> tuple[np.ndarray, np.ndarray]:
    obs, _ = env.reset(seed=11)
    observations, rewards = [obs], []
    rng = np.random.default_rng(0)
    for _ in range(steps):
        action = rng.uniform(-2, 2, (env.num_envs, 1)).astype(np.float32)
        obs, reward, *_ = env.step(action)
        observations.append(obs)
        rewards.append(reward)
    env.close()
    return np.array(observations), np.array(rewards)


@pytest.mark.parametrize("cost", COSTS)
def test_a_costly_step_spends_its_time_and_keeps_the_dynamics(cost):
    if cost == "native":
        pytest.importorskip("mujoco")
    import gymnasium as gym

    plain = rollout(gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync"))
    costly_env = make_costly_vec(0, "Pendulum-v1", num_envs=2, cost_s=0.002, cost=cost)
    start = time.thread_time()
    costly = rollout(costly_env)
    spent = time.thread_time() - start
    np.testing.assert_array_equal(costly[0], plain[0])
    np.testing.assert_array_equal(costly[1], plain[1])
    assert spent >= 30 * 2 * 0.002  # 30 vector steps of 2 envs, 2 ms of CPU each


def test_the_native_cost_is_spent_in_mujoco():
    pytest.importorskip("mujoco")
    spender = NativeSpender()
    start = time.thread_time()
    spender(0.005)
    assert time.thread_time() - start >= 0.005
    assert spender.data.time > 0  # the Humanoid's physics advanced: the time went to mj_step


def test_an_unknown_cost_is_refused():
    with pytest.raises(ValueError, match="nativ"):
        make_costly_vec(0, "Pendulum-v1", num_envs=1, cost_s=0.001, cost="nativ")
