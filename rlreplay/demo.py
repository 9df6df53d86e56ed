"""`rlreplay demo`: train an agent through replay, with a live progress bar.

The default is DQN on CartPole-v1 with prioritized n-step replay on the threads backend.
The run writes ``metrics.csv``, ``summary.json`` and ``learning_curve.png`` to ``--out``
(:func:`default_out`; ``''`` writes nothing). The agents are the example files
(``examples/*.py``, installed as ``rlreplay.examples``).
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from rlreplay.errors import InvalidArgumentError, describe

# agent name -> (example module, what it trains)
AGENTS = {
    "dqn": ("dqn_cartpole", "DQN with prioritized n-step replay on CartPole-v1"),
    "sac": ("sac_continuous", "SAC on Pendulum-v1 (other tasks: the example's --env-id)"),
    "ppo": ("ppo_cartpole", "PPO on CartPole-v1, on-policy through a queue table"),
    "apex": ("apex_dqn", "Ape-X DQN: actor processes with an epsilon ladder, a replay server"),
}
NEEDS = ("torch", "gymnasium")
OUTPUTS = ("metrics.csv", "summary.json", "learning_curve.png")  # what a run writes to --out


def default_out(agent: str) -> str:
    """The folder a run of ``agent`` writes to without ``--out``: ``runs/<example>``."""
    return f"runs/{AGENTS[agent][0]}"

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
    """Train ``agent`` (see :data:`AGENTS`) and return its summary; options left ``None`` keep
    the example's defaults, ``out=""`` writes nothing.

    Raises:
        InvalidArgumentError: for an unknown agent, or when torch or gymnasium is missing.
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
    argv: list[str] = ["--out", default_out(agent) if out is None else str(out)]
    for flag, value in (("--seed", seed), ("--total-steps", total_steps),
                        ("--backend", backend)):
        if value is not None:
            argv += [flag, str(value)]
    return module.main(argv)


def written(out: str) -> str:
    """The demo's last line: where its files are (or that it wrote none)."""
    if not out:
        return "no files written (--out '')"
    folder = Path(out)
    found = [name for name in OUTPUTS if (folder / name).exists()]
    return f"files in {folder.resolve()}: {', '.join(found) or 'none'}"
