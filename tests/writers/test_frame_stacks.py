"""Observations that arrive as frame stacks (``stacked_obs=True``) store one frame per
step, give the same items as single frames, and are checked like any other input."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from counting_env import CountingEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from test_nstep_adder import check_items

from rlreplay import Fifo, NStepTransitionAdder, SignatureError, Table

K = 3


def stacked_envs(mode: str, num_envs: int = 2) -> SyncVectorEnv:
    """CountingEnvs under gymnasium's FrameStackObservation (padding repeats the reset)."""
    am = AutoresetMode.NEXT_STEP if mode == "next_step" else AutoresetMode.SAME_STEP
    return SyncVectorEnv(
        [
            lambda i=i: gym.wrappers.FrameStackObservation(CountingEnv(tag=i, max_len=6), K)
            for i in range(num_envs)
        ],
        autoreset_mode=am,
    )


def make(mode: str, num_envs: int | None = 2):
    sig = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")
    table = Table(
        "t",
        signature=sig,
        capacity=2048,
        layout=NStepTransitionAdder.layout(sig, n=2, stack=K),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = NStepTransitionAdder(
        table,
        n=2,
        discount=0.9,
        stack=K,
        stacked_obs=True,
        num_envs=num_envs,
        autoreset_mode=mode,
        chunk_length=4,
    )
    return table, adder


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_stacked_observations_give_the_items_of_single_frames(mode):
    envs = stacked_envs(mode)
    table, adder = make(mode)
    obs, _ = envs.reset(seed=5)
    adder.reset(obs)
    rng = np.random.default_rng(5)
    for _ in range(40):
        action = rng.integers(5, size=2)
        obs, reward, term, trunc, info = envs.step(action)
        adder.add(action, reward, obs, term, trunc, info)
    adder.end_episode()
    logs = {(e.unwrapped.tag, k): ep for e in envs.envs for k, ep in enumerate(e.unwrapped.log)}
    envs.close()
    assert table.store.signature["obs"].shape == (3,)  # one frame per stored step
    size = table.size
    assert size == sum(len(ep["rewards"]) for ep in logs.values())
    assert check_items(table.sample(size).data, logs, 2, 0.9, K) == size


@pytest.mark.parametrize(
    ("call", "text"),
    [
        pytest.param(lambda a, s: a.add(1, 1.0, s[-1], False, False), "next_obs", id="one_frame"),
        pytest.param(lambda a, s: a.add(1, 1.0, s[:, :2], False, False), "next_obs", id="frame"),
        pytest.param(lambda a, s: a.reset(s[-1]), "obs", id="reset_one_frame"),
    ],
)
def test_unstacked_observations_are_refused_and_change_nothing(call, text):
    table, adder = make("next_step", num_envs=None)
    stack = np.zeros((K, 3), np.float32)
    adder.reset(stack)
    with pytest.raises(SignatureError, match=text):
        call(adder, stack + 1)
    adder.add(1, 1.0, stack + 1, True, False)
    data = table.sample(table.size).data
    np.testing.assert_array_equal(data["obs"], np.zeros((1, K, 3)))
    np.testing.assert_array_equal(data["next_obs"][0, -1], np.ones(3))
