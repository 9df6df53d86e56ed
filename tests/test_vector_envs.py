"""Adders on real gymnasium vector envs in both autoreset modes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from rlreplay import Fifo, NStepTransitionAdder, Table

MODES = [
    pytest.param(AutoresetMode.NEXT_STEP, id="next_step"),
    pytest.param(AutoresetMode.SAME_STEP, id="same_step"),
]


def cartpole_step(obs: np.ndarray, action: int) -> np.ndarray:
    """CartPole's deterministic dynamics from a given state (the environment's own code)."""
    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    env.state = obs.astype(np.float64)
    return env.step(int(action))[0]


@pytest.mark.parametrize("mode", MODES)
def test_cartpole_transitions_follow_the_dynamics_and_never_span_a_reset(mode):
    envs = gym.make_vec(
        "CartPole-v1",
        num_envs=4,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": mode},
    )
    sig = NStepTransitionAdder.signature(obs=((4,), "float32"), action="int64")
    table = Table(
        "t",
        signature=sig,
        max_size=4096,
        layout=NStepTransitionAdder.layout(sig, 1),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = NStepTransitionAdder(
        table, n=1, discount=0.9, num_envs=4, autoreset_mode=mode, chunk_length=8
    )
    obs, _ = envs.reset(seed=1)
    adder.reset(obs)
    rng = np.random.default_rng(1)
    transitions = ended = 0
    skip = np.zeros(4, dtype=bool)
    for _ in range(300):
        action = rng.integers(2, size=4)
        obs, reward, term, trunc, info = envs.step(action)
        adder.add(action, reward, obs, term, trunc, info)
        real = ~skip if mode == AutoresetMode.NEXT_STEP else np.ones(4, dtype=bool)
        transitions += int(real.sum())
        ended += int((real & term).sum())
        skip = term | trunc
    envs.close()
    adder.end_episode()
    size = table.size
    assert size == transitions  # no item for the autoreset steps
    data = table.sample(size).data
    for k in range(0, size, 7):
        expected = cartpole_step(data["obs"][k], data["action"][k])
        np.testing.assert_allclose(data["next_obs"][k], expected, rtol=1e-5, atol=1e-6)
    assert int((data["discount"] == 0).sum()) == ended
    np.testing.assert_allclose(data["reward"], 1.0)


@pytest.mark.parametrize("mode", MODES)
def test_truncated_episodes_bootstrap_from_the_true_final_observation(mode):
    from counting_env import CountingEnv
    from gymnasium.vector import SyncVectorEnv

    def make(i):
        return lambda: gym.wrappers.TimeLimit(CountingEnv(tag=i, max_len=50, p_terminal=0.0), 4)

    envs = SyncVectorEnv([make(i) for i in range(2)], autoreset_mode=mode)
    sig = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")
    table = Table(
        "t",
        signature=sig,
        max_size=512,
        layout=NStepTransitionAdder.layout(sig, 3),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = NStepTransitionAdder(table, n=3, discount=0.5, num_envs=2, autoreset_mode=mode)
    obs, _ = envs.reset(seed=0)
    adder.reset(obs)
    steps = 14 if mode == AutoresetMode.NEXT_STEP else 12  # 3 whole episodes per env
    for _ in range(steps):
        obs, reward, term, trunc, info = envs.step(np.zeros(2, dtype=np.int64))
        adder.add(np.zeros(2, dtype=np.int64), reward, obs, term, trunc, info)
    size = table.size
    data = table.sample(size).data
    # Every episode is cut at 4 steps: items from t=1..3 end at the final obs t=4.
    t = data["obs"][:, 2]
    m = np.minimum(3, 4 - t)
    np.testing.assert_array_equal(data["next_obs"][:, 2], t + m)
    np.testing.assert_array_equal(data["next_obs"][:, 1], data["obs"][:, 1])  # same episode
    np.testing.assert_allclose(data["discount"], 0.5**m)
    assert size == 2 * 3 * 4
