"""Adders on real gymnasium vector envs in both autoreset modes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from rlreplay import Fifo, InvalidArgumentError, NStepTransitionAdder, Table

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
    adder.flush()  # the last episodes' items may still be staged
    size = table.size
    data = table.sample(size).data
    # Every episode is cut at 4 steps: items from t=1..3 end at the final obs t=4.
    t = data["obs"][:, 2]
    m = np.minimum(3, 4 - t)
    np.testing.assert_array_equal(data["next_obs"][:, 2], t + m)
    np.testing.assert_array_equal(data["next_obs"][:, 1], data["obs"][:, 1])  # same episode
    np.testing.assert_allclose(data["discount"], 0.5**m)
    assert size == 2 * 3 * 4


def _adder_for(obs_shape: tuple[int, ...], num_envs: int, mode: str = "next_step"):
    sig = NStepTransitionAdder.signature(obs=(obs_shape, "float32"), action="int64")
    table = Table(
        "t",
        signature=sig,
        max_size=4096,
        layout=NStepTransitionAdder.layout(sig, 1),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = NStepTransitionAdder(table, n=1, discount=0.9, num_envs=num_envs, autoreset_mode=mode)
    return table, adder


@pytest.mark.parametrize(
    ("env_mode", "adder_mode", "advice"),
    [
        pytest.param(
            AutoresetMode.SAME_STEP, "next_step", "same_step", id="same_step_env_next_step_adder"
        ),
        pytest.param(
            AutoresetMode.NEXT_STEP, "same_step", "next_step", id="next_step_env_same_step_adder"
        ),
    ],
)
def test_cartpole_in_the_other_autoreset_mode_is_refused_at_the_first_episode_end(
    env_mode, adder_mode, advice
):
    envs = gym.make_vec(
        "CartPole-v1",
        num_envs=4,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": env_mode},
    )
    table, adder = _adder_for((4,), 4, adder_mode)
    obs, _ = envs.reset(seed=2)
    adder.reset(obs)
    rng = np.random.default_rng(2)
    for _ in range(500):
        action = rng.integers(2, size=4)
        obs, reward, term, trunc, info = envs.step(action)
        if (term | trunc).any():
            with pytest.raises(InvalidArgumentError, match=f"autoreset_mode='{advice}'"):
                adder.add(action, reward, obs, term, trunc, info)
            break
        adder.add(action, reward, obs, term, trunc, info)
    else:
        pytest.fail("no CartPole episode ended in 500 steps")
    envs.close()
    adder.end_episode()
    data = table.sample(table.size).data
    for k in range(table.size):  # nothing stored holds a reset observation as a final one
        expected = cartpole_step(data["obs"][k], data["action"][k])
        np.testing.assert_allclose(data["next_obs"][k], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("key", ["final_obs", "final_observation"])
def test_counting_env_same_step_final_obs_is_read_in_same_step_mode_and_refused_in_next_step(key):
    from counting_env import make_vec

    results = {}
    for mode in ("same_step", "next_step"):
        envs, obs = make_vec(2, "same_step", seed=7, max_len=3)
        table, adder = _adder_for((3,), 2, mode)
        adder.reset(obs)
        refused = 0
        for _ in range(12):
            obs, reward, term, trunc, info = envs.step(np.zeros(2, dtype=np.int64))
            if "final_obs" in info and key != "final_obs":
                info = {key if k == "final_obs" else k: v for k, v in info.items()}
            try:
                adder.add(np.zeros(2, dtype=np.int64), reward, obs, term, trunc, info)
            except InvalidArgumentError:
                refused += 1
                break
        results[mode] = (refused, table)
    assert results["next_step"][0] == 1
    refused, table = results["same_step"]
    assert refused == 0 and table.size > 0
    data = table.sample(table.size).data
    # CountingEnv observations are [tag, episode, t]: next_obs is the same episode's next t.
    np.testing.assert_array_equal(data["next_obs"][:, 1], data["obs"][:, 1])
    np.testing.assert_array_equal(data["next_obs"][:, 2], data["obs"][:, 2] + 1)
