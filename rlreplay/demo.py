"""`rlreplay demo`: train an agent through replay, with a live progress bar.

The default is DQN on CartPole-v1 with prioritized n-step replay on the embedded (threads)
backend: actors and learner run in parallel and meet only through one table, whose rate
limiter holds the ratio of updates to env steps. The progress bar shows env steps/s,
updates/s, the observed samples per insert, policy lag and returns; the run writes
``metrics.csv``, ``summary.json`` and ``learning_curve.png`` to ``--out``. The agents are the
example files (``examples/*.py``, installed as ``rlreplay.examples``).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from rlreplay.errors import InvalidArgumentError, describe

# agent name -> (example module, what it trains)
AGENTS = {
    "dqn": ("dqn_cartpole", "DQN with prioritized n-step replay on CartPole-v1"),
    "sac": ("sac_pendulum", "SAC on Pendulum-v1"),
    "ppo": ("ppo_cartpole", "PPO on CartPole-v1, on-policy through a queue table"),
    "apex": ("apex_dqn", "Ape-X DQN: actor processes with an epsilon ladder, a replay server"),
}
NEEDS = ("torch", "gymnasium")
INSTALL = 'python -m pip install "rlreplay[examples]"'


def missing_modules() -> list[str]:
    """The modules the demo needs that are not installed."""
    return [name for name in NEEDS if importlib.util.find_spec(name) is None]


def run_demo(
    agent: str = "dqn",
    *,
    seed: int | None = None,
    total_steps: int | None = None,
    backend: str | None = None,
    out: str | None = None,
) -> dict[str, Any]:
    """Train ``agent`` (see :data:`AGENTS`) and return its summary.

    Options left ``None`` keep the example's defaults.

    Raises:
        InvalidArgumentError: for an unknown agent, or when torch or gymnasium is missing
            (with the command that installs them).
    """
    if agent not in AGENTS:
        raise InvalidArgumentError(
            f"agent={describe(agent)} is unknown; choose one of {sorted(AGENTS)}"
        )
    missing = missing_modules()
    if missing:
        raise InvalidArgumentError(
            f"the demo trains a network on a gymnasium environment and needs {missing}, "
            f"which are not installed; install them with: {INSTALL}"
        )
    module = importlib.import_module(f"rlreplay.examples.{AGENTS[agent][0]}")
    argv: list[str] = []
    for flag, value in (("--seed", seed), ("--total-steps", total_steps),
                        ("--backend", backend), ("--out", out)):
        if value is not None:
            argv += [flag, str(value)]
    return module.main(argv)
