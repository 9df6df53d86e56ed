"""A small gymnasium environment with known dynamics that logs every episode it plays.

Observation ``[tag, episode, t]``; reward drawn per step; each episode lasts a random
number of steps and ends terminated or truncated at random. The log is the ground truth
the adder tests compare against, independent of how a vector env autoresets.
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env):
    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, tag: int = 0, max_len: int = 10, p_terminal: float = 0.5):
        self.tag = tag
        self.max_len = max_len
        self.p_terminal = p_terminal
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(5)
        self.log: list[dict] = []

    def _obs(self) -> np.ndarray:
        return np.array([self.tag, len(self.log) - 1, self.t], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.length = int(self.np_random.integers(1, self.max_len + 1))
        self.terminal = bool(self.np_random.random() < self.p_terminal)
        self.t = 0
        self.log.append({"obs": [], "actions": [], "rewards": [], "terminated": False})
        obs = self._obs()
        self.log[-1]["obs"].append(obs)
        return obs, {}

    def step(self, action):
        reward = float(np.round(self.np_random.normal(), 3))
        self.t += 1
        end = self.t >= self.length
        term, trunc = end and self.terminal, end and not self.terminal
        ep = self.log[-1]
        ep["actions"].append(int(action))
        ep["rewards"].append(reward)
        ep["terminated"] = term
        obs = self._obs()
        ep["obs"].append(obs)
        return obs, reward, term, trunc, {}


def make_vec(num_envs: int, mode: str, seed: int, max_len: int = 10):
    """A ``SyncVectorEnv`` of CountingEnvs in the given autoreset mode ("next_step"/...)."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    am = AutoresetMode.NEXT_STEP if mode == "next_step" else AutoresetMode.SAME_STEP
    envs = SyncVectorEnv(
        [lambda i=i: CountingEnv(tag=i, max_len=max_len) for i in range(num_envs)],
        autoreset_mode=am,
    )
    obs, _ = envs.reset(seed=seed)
    return envs, obs


def episodes(envs) -> dict[tuple[int, int], dict]:
    """``{(tag, episode): log}`` of every episode the vector env's copies played."""
    return {(e.tag, k): ep for e in envs.envs for k, ep in enumerate(e.log)}
