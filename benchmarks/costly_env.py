"""An environment made slower by design: every step first spends a fixed CPU time.

For the acting-costs-as-much-as-learning comparisons of :mod:`benchmarks.async_vs_sync`:
:class:`CostlyStep` wraps a gymnasium env and, before each ``step``, spends ``cost_s``
seconds of this thread's CPU time in one of two ways:

* ``"python"``: a plain Python loop, holding the interpreter lock all along (a simulator
  written in Python, as many research environments are);
* ``"native"``: MuJoCo's ``mj_step`` on a Humanoid model, 10 physics steps a call,
  called until the time has passed (a simulator in C; MuJoCo releases the interpreter lock
  inside ``mj_step``, as a C extension doing long work should). A call takes about 0.9 ms
  here, so a step overshoots its budget by up to that much: 4 ms asked cost about 4.8 ms.

The dynamics, observations and rewards are the wrapped env's, unchanged, so learning per
env step is the same as on the plain env; only the cost of a step differs, and where it
is spent decides whether another thread of the same process can run meanwhile.

:func:`make_costly_vec` is a picklable ``make_env(seed)`` for the runtime (a processes
backend sends it to the actor process): a sync vector env of ``num_envs`` costly envs.
"""

from __future__ import annotations

import time
from typing import Any

COSTS = ("python", "native")


def spend(cost_s: float) -> None:
    """Run Python bytecode until ``cost_s`` seconds of this thread's CPU time passed."""
    end = time.thread_time() + cost_s
    while time.thread_time() < end:
        for _ in range(50):
            pass


class NativeSpender:
    """Spends CPU time inside MuJoCo's ``mj_step`` (the interpreter lock released)."""

    def __init__(self) -> None:
        import gymnasium as gym
        import mujoco

        env = gym.make("Humanoid-v5")
        self.model = env.unwrapped.model
        self.data = mujoco.MjData(self.model)
        self.mj_step = mujoco.mj_step
        env.close()

    def __call__(self, cost_s: float) -> None:
        end = time.thread_time() + cost_s
        while time.thread_time() < end:
            self.mj_step(self.model, self.data, nstep=10)


def make_costly_vec(
    seed: int, env_id: str, num_envs: int, cost_s: float, cost: str = "python"
) -> Any:
    """A sync vector env of ``num_envs`` copies of ``env_id`` whose steps cost ``cost_s``
    seconds of CPU time, spent as ``cost`` says (one of :data:`COSTS`)."""
    import gymnasium as gym

    if cost not in COSTS:
        raise ValueError(f"cost={cost!r} is not one of {COSTS}")
    spender = NativeSpender() if cost == "native" else spend

    class CostlyStep(gym.Wrapper):
        """``env`` whose every step first spends ``cost_s`` seconds of CPU time."""

        def step(self, action: Any) -> Any:
            spender(cost_s)
            return self.env.step(action)

    return gym.vector.SyncVectorEnv(
        [lambda: CostlyStep(gym.make(env_id)) for _ in range(num_envs)]
    )
