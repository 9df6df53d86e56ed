"""Small picklable parts for runtime tests: a CartPole vector env, a random policy that
records what it acted with, and learners that count, fail or zero their weights."""

from __future__ import annotations

import functools
import os
import time

import numpy as np

import rlreplay as rr
import rlreplay.runtime as rt

NUM_ENVS = 2
SIGNATURE = rr.NStepTransitionAdder.signature(
    obs=((4,), "float32"), action="int64", extras={rt.POLICY_VERSION: "int64"}
)

# What the policies of this process acted with, by actor index (threads and inline).
SEEN: dict[int, list[tuple[int, float]]] = {}


def make_env(seed: int):
    import gymnasium as gym

    return gym.make_vec("CartPole-v1", num_envs=NUM_ENVS, vectorization_mode="sync")


def replay(max_size: int = 5_000, sampler=None, n: int = 2) -> rt.ReplaySpec:
    return rt.ReplaySpec(
        signature=SIGNATURE,
        layout=rr.NStepTransitionAdder.layout(SIGNATURE, n=n),
        adder=functools.partial(rr.NStepTransitionAdder, n=n, discount=0.99),
        max_size=max_size,
        sampler=sampler,
    )


class RandomPolicy:
    """Acts at random from its own seed; records (env_steps, w) of every call."""

    def __init__(self, index: int, num_actors: int, seed: int):
        self.index = index
        self.rng = np.random.default_rng(seed)
        self.w = float("nan")
        self.env_steps = 0
        SEEN[index] = []

    def set_params(self, params):
        self.w = float(params["w"][0])

    def __call__(self, obs, env_steps):
        self.env_steps = env_steps
        SEEN[self.index].append((env_steps, self.w))
        return self.rng.integers(2, size=len(obs))


class CrashingPolicy(RandomPolicy):
    """Raises after 200 env steps (actor failure)."""

    def __call__(self, obs, env_steps):
        if env_steps >= 200:
            raise RuntimeError("policy exploded")
        return super().__call__(obs, env_steps)


class StuckOrCrashingPolicy(RandomPolicy):
    """After 200 env steps actor 0 raises; the others are stuck in a 30 s call."""

    def __call__(self, obs, env_steps):
        if env_steps >= 200:
            if self.index == 0:
                raise RuntimeError("policy exploded")
            time.sleep(30)
        return super().__call__(obs, env_steps)


class DyingPolicy(RandomPolicy):
    """Actor 0's process kills itself with SIGKILL after 300 env steps."""

    def __call__(self, obs, env_steps):
        if self.index == 0 and env_steps >= 300:
            os.kill(os.getpid(), 9)
        return super().__call__(obs, env_steps)


class CountingLearner:
    """Counts updates; its one weight is the update count; remembers batch digests.

    ``zero_at``: from that update on its weight is 0, and ``published_at`` records the
    actors' env steps just before the zero weights were handed over.
    """

    def __init__(self, fail_at: int | None = None, zero_at: int | None = None,
                 delay_s: float = 0.0):
        self.updates = 0
        self.fail_at = fail_at
        self.zero_at = zero_at
        self.delay_s = delay_s
        self.digests: list[int] = []
        self.versions: list[np.ndarray] = []
        self.zeroed_steps: dict[int, int] | None = None

    def update(self, batch):
        self.updates += 1
        if self.fail_at is not None and self.updates >= self.fail_at:
            raise ValueError("loss is nan")
        if self.delay_s:
            time.sleep(self.delay_s)
        self.digests.append(hash(batch.data["obs"].tobytes()))
        self.versions.append(batch.data[rt.POLICY_VERSION].copy())
        return np.abs(batch.data["reward"]).astype(np.float64) + 0.1

    def params(self):
        zero = self.zero_at is not None and self.updates >= self.zero_at
        if zero and self.zeroed_steps is None:
            self.zeroed_steps = {i: policy_steps(i) for i in SEEN}
        return {"w": np.array([0.0 if zero else 1.0 + self.updates])}


def policy_steps(index: int) -> int:
    seen = SEEN.get(index) or [(0, 0.0)]
    return seen[-1][0]


def make_env16(seed: int):
    import gymnasium as gym

    return gym.make_vec("CartPole-v1", num_envs=16, vectorization_mode="sync")
