"""Ape-X DQN on CartPole-v1: actor processes with an epsilon ladder, a replay server, a learner.

Ape-X (Horgan et al., 2018) runs many actors, each env exploring with its own fixed
epsilon from a ladder ``eps_i = eps_base ** (1 + eps_alpha * i / (N - 1))`` over all N envs
of all actors, so a few envs explore a lot and most act nearly greedily. The actors write
n-step transitions to one prioritized replay table; the learner takes double-DQN steps on
sampled batches, writes the new priorities back and publishes its weights, which the
actors pull every ``weight_sync_period`` env steps.

Here the actors are processes (``--backend processes``: a replay server on 127.0.0.1 hosts
the table and the weights), and the learner is DQN's (``examples/dqn_cartpole.py``): only
the policy differs. The ratio of updates to env steps is held by the table's rate limiter,
so adding actors adds throughput only until the learner is the bottleneck; on a 2-core
machine one core runs the learner and the server, the other the actors.

With ``--backend ray`` the table is sharded over ``--replay-shards`` replay servers (2 by
default) running as Ray actors, the actors are Ray actors writing each to one shard, and
the learner samples all shards at once with the global priorities
(:class:`rlreplay.ShardedClient`); it starts a local Ray unless one is running.

Run it::

    python examples/apex_dqn.py --num-actors 2 --out runs/apex_dqn
    python examples/apex_dqn.py --backend ray --replay-shards 2   # needs rlreplay[ray]
    python examples/apex_dqn.py --scaling 1 2 4      # throughput table for 1, 2, 4 actors
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    from rlreplay.examples import dqn_cartpole as dqn
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import dqn_cartpole as dqn  # type: ignore[no-redef]

from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.runtime.flags import parse_flags, run_script


@dataclass
class ApexArgs(dqn.Args):
    """DQN's flags with Ape-X's defaults, plus the epsilon ladder."""

    backend: str = "processes"
    """runtime backend: processes (actors as processes, a replay server), ray (replay
    shards and actors as Ray actors on a local or running Ray), threads, inline"""
    out: str = "runs/apex_dqn"
    """folder for metrics.csv, summary.json and learning_curve.png ('' writes nothing)"""
    num_actors: int = 2
    """actor processes"""
    replay_shards: int = 2
    """replay servers the table is sharded over (--backend ray only)"""
    n_step: int = 3
    """steps summed into each transition's return (Ape-X's 3; DQN's 10 ended 6 of seeds
    100-109 at the target here, 8 with 3: the ladder's envs explore with epsilons up to
    0.4, and a 10-step return of such an env says little about the greedy policy)"""
    eps_base: float = 0.4
    """epsilon of the most exploring env"""
    eps_alpha: float = 7.0
    """how steeply epsilon falls along the ladder"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.eps_base, (int, float)) or not 0.0 < self.eps_base < 1.0:
            raise InvalidArgumentError(f"--eps-base={describe(self.eps_base)} must be in (0, 1)")
        if not isinstance(self.eps_alpha, (int, float)) or not self.eps_alpha >= 0.0:
            raise InvalidArgumentError(f"--eps-alpha={describe(self.eps_alpha)} must be >= 0")


def epsilon_ladder(first: int, count: int, total: int, base: float, alpha: float) -> np.ndarray:
    """Epsilons of envs ``first .. first + count - 1`` of a ladder over ``total`` envs."""
    i = np.arange(first, first + count, dtype=np.float64)
    return base ** (1.0 + alpha * i / max(1, total - 1))


class LadderPolicy(dqn.QPolicy):
    """Epsilon-greedy with one fixed epsilon per env, from the Ape-X ladder over every env
    of every actor (actor ``a``'s envs are rungs ``a * num_envs ...``)."""

    def __init__(self, actor_index: int, num_actors: int, seed: int, args: ApexArgs):
        super().__init__(actor_index, num_actors, seed, args)
        n = args.num_envs
        self.epsilons = epsilon_ladder(
            actor_index * n, n, num_actors * n, args.eps_base, args.eps_alpha
        )

    def __call__(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        n = len(obs)
        random_actions = self.rng.integers(dqn.NUM_ACTIONS, size=n)
        if self.params is None:
            return random_actions
        greedy = dqn.q_values(self.params, np.asarray(obs, dtype=np.float32)).argmax(axis=1)
        explore = self.rng.random(n) < self.epsilons[:n]
        return np.where(explore, random_actions, greedy).astype(np.int64)


def scaling(args: ApexArgs, actor_counts: list[int]) -> list[dict[str, Any]]:
    """Throughput with each number of actors (short runs, no evaluation): env steps/s,
    updates/s, and how long actors were blocked by the limiter and the learner waited."""
    rows = []
    for count in actor_counts:
        run_args = dataclasses.replace(
            args, num_actors=count, out="", progress=False, eval_every=10 ** 9,
            eval_episodes=1,
        )
        summary = dqn.train(run_args, policy=LadderPolicy)
        wall = summary["wall_s"] or float("nan")
        rows.append({
            "actors": count,
            "env_steps_per_s": summary["env_steps"] / wall,
            "updates_per_s": summary["updates"] / wall,
            "wall_s": wall,
        })
        print(f"{count} actors: {rows[-1]['env_steps_per_s']:.0f} env steps/s, "
              f"{rows[-1]['updates_per_s']:.0f} updates/s", flush=True)
    return rows


SCALING_HELP = (
    "--scaling N [N ...]: instead of training, measure throughput with N actors for each N "
    "given (e.g. --scaling 1 2 4), one line per count"
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train Ape-X DQN (or, with ``--scaling``, measure throughput) and return the summary.

    Raises:
        SystemExit: for an unknown flag (argparse).
        InvalidArgumentError: for a flag out of range.
        ComponentFailedError: when an actor or the learner failed (see its message).
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--scaling", type=int, nargs="+", default=None, help=SCALING_HELP)
    known, rest = parser.parse_known_args(argv)
    args = parse_flags(ApexArgs, rest, __doc__, epilog=SCALING_HELP)
    if known.scaling:
        if any(c < 1 for c in known.scaling):
            raise InvalidArgumentError(f"--scaling={known.scaling} must list actor counts >= 1")
        rows = scaling(args, known.scaling)
        return {"scaling": rows, "total_steps": args.total_steps, "backend": args.backend}
    return dqn.train(args, policy=LadderPolicy)


if __name__ == "__main__":
    run_script(main)
