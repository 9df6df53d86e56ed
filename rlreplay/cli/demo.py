"""``rlreplay demo``: an agent trained through replay (see :mod:`rlreplay.demo`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rlreplay.cli.parsing import CommandError, positive
from rlreplay.runtime.config import BACKENDS


def cmd_demo(args: argparse.Namespace) -> int:
    from rlreplay.demo import INSTALL, default_out, missing_modules, run_demo, written

    missing = missing_modules()
    if missing:
        raise CommandError(
            f"the demo trains a network and needs {missing}, which are not installed: {INSTALL}"
        )
    out = default_out(args.agent) if args.out is None else args.out
    if out:  # checked before training, not at its end
        try:
            Path(out).mkdir(parents=True, exist_ok=True)
            reason = None if os.access(out, os.W_OK) else "it is not writable"
        except OSError as error:
            reason = f"{type(error).__name__}: {error}"
        if reason is not None:
            raise CommandError(
                f"--out={out!r} cannot hold the run's files ({reason}); give a folder you "
                "can write, or --out '' to write none"
            )
    summary = run_demo(
        args.agent, seed=args.seed, total_steps=args.total_steps, backend=args.backend,
        out=out,
    )
    target = summary.get("samples_per_insert_target")
    observed = summary.get("samples_per_insert_observed")
    ratio = (
        "on-policy: each item sampled once" if target is None
        else f"samples per insert {observed or 0:.2f} (target {target:g})"
    )
    goal, reached = summary.get("target"), summary.get("steps_to_target")
    verdict = (
        "" if goal is None
        else f" (target {goal:g}: first reached at env step {reached:,})" if reached is not None
        else f" (target {goal:g}: not reached; train longer with --total-steps)"
    )
    final = summary.get("final_eval_return")
    final = "-" if final is None else f"{final:.1f}"
    print(
        f"done: {summary.get('env_steps')} env steps in {summary.get('wall_s') or 0:.0f}s, "
        f"final evaluation return {final}{verdict}, {ratio}"
    )
    if summary.get("updates") == 0:
        print(
            f"warning: no gradient update ran: {summary.get('env_steps')} env steps are too "
            "few for the agent to start learning; train longer (--total-steps, default: "
            "the agent's)"
        )
    print(written(out), flush=True)
    return 0


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    from rlreplay.demo import AGENTS

    p = sub.add_parser(
        "demo", help="train an agent through replay (default: DQN on CartPole, threads)"
    )
    p.add_argument(
        "--agent", choices=sorted(AGENTS), default="dqn",
        help="; ".join(f"{name}: {what}" for name, (_, what) in AGENTS.items()),
    )
    p.add_argument("--seed", type=int, default=None, help="seed (default: the agent's)")
    p.add_argument(
        "--total-steps", type=positive(int), default=None, metavar="N",
        help="env steps to train for (default: the agent's)",
    )
    p.add_argument(
        "--backend", choices=BACKENDS, default=None,
        help="where actors and learner run (default: the agent's own; ray needs the ray "
        "extra)",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR",
        help="folder for metrics.csv, summary.json and learning_curve.png (default: "
        "runs/<example>, e.g. runs/dqn_cartpole; '' writes nothing)",
    )
    p.set_defaults(func=cmd_demo)
