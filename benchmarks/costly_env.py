"""An environment made slower by design: every step first spends a fixed CPU time.

For the acting-costs-as-much-as-learning comparison of :mod:`benchmarks.async_vs_sync`:
:class:`CostlyStep` wraps a gymnasium env and, before each ``step``, runs a plain Python
loop until ``cost_s`` seconds of this thread's CPU time have passed (a simulator written
in Python, holding the interpreter lock all along, as many research environments are).
The dynamics, observations and rewards are the wrapped env's, unchanged, so learning per
env step is the same as on the plain env; only the cost of a step differs.

:func:`make_costly_vec` is a picklable ``make_env(seed)`` for the runtime (a processes
backend sends it to the actor process): a sync vector env of ``num_envs`` costly envs.
"""

from __future__ import annotations

import time
from typing import Any


def spend(cost_s: float) -> None:
    """Run Python bytecode until ``cost_s`` seconds of this thread's CPU time passed."""
    end = time.thread_time() + cost_s
    while time.thread_time() < end:
        for _ in range(50):
            pass


def make_costly_vec(seed: int, env_id: str, num_envs: int, cost_s: float) -> Any:
    """A sync vector env of ``num_envs`` copies of ``env_id`` whose steps cost ``cost_s``."""
    import gymnasium as gym

    class CostlyStep(gym.Wrapper):
        """``env`` whose every step first spends ``cost_s`` seconds of CPU time."""

        def step(self, action: Any) -> Any:
            spend(cost_s)
            return self.env.step(action)

    return gym.vector.SyncVectorEnv(
        [lambda: CostlyStep(gym.make(env_id)) for _ in range(num_envs)]
    )
