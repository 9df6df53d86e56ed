"""Adder throughput and context-copy overhead by number of environments and chunk length.

Feeds synthetic vector-env steps (obs float32[8], episodes of 50-150 steps, next-step
autoreset) to an NStepTransitionAdder(n=3) over one table and reports environment
steps per second and the share of stored rows that are re-appended context. Two more rows
use short episodes (10-35 steps, as a random CartPole policy plays them), where episodes
of several environments end in most calls: what one call hands over for every
environment goes to the writer as one chunk, and ``chunks/call`` shows how many. The
short-episode rows are measured on both of the adder's paths: ``blocks`` (calls recorded
and settled every ``hand_over_every`` calls, see :mod:`rlreplay.writers.nstep_blocks`;
the default for small rows) and ``per-call`` (each call's episodes cut as they end).

Run: ``python benchmarks/bench_adders.py [--env-steps N]`` (``--help`` for the options).
Prints a table and writes JSON to benchmarks/results/bench_adders.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlreplay import NStepTransitionAdder, Table, TrajectoryWriter


class CountingWriter(TrajectoryWriter):
    """A TrajectoryWriter that counts its ``append_batch`` calls (the adder's chunks)."""

    appends = 0

    def append_batch(self, steps, *, timeout=None):
        self.appends += 1
        return super().append_batch(steps, timeout=timeout)


class PerCallAdder(NStepTransitionAdder):
    """The n-step adder on its per-call path."""

    def _new_block(self, every):
        return None


def run(
    num_envs: int, chunk: int, env_steps: int = 60_000, lengths=(50, 150), per_call=False
) -> dict:
    sig = NStepTransitionAdder.signature(obs=((8,), "float32"), action="int64")
    table = Table(
        "t", signature=sig, capacity=2 * env_steps, layout=NStepTransitionAdder.layout(sig, n=3)
    )
    writer = CountingWriter(table, history=chunk + 16)  # what the adder keeps, and more
    cls = PerCallAdder if per_call else NStepTransitionAdder
    adder = cls(writer, n=3, discount=0.99, num_envs=num_envs, chunk_length=chunk)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(num_envs, 8)).astype(np.float32)
    left = rng.integers(*lengths, size=num_envs)
    adder.reset(obs)
    calls = env_steps // num_envs
    action = np.zeros(num_envs, dtype=np.int64)
    reward = np.ones(num_envs, dtype=np.float32)
    trunc = np.zeros(num_envs, dtype=bool)
    start = time.perf_counter()
    for _ in range(calls):
        left -= 1
        term = left <= 0
        adder.add(action, reward, obs, term, trunc)
        left[term] = rng.integers(*lengths, size=int(term.sum()))
    elapsed = time.perf_counter() - start
    return {
        "num_envs": num_envs,
        "chunk_length": chunk,
        "path": "per-call" if adder._block is None else "blocks",
        "episode_steps": list(lengths),
        "chunks_per_call": writer.appends / calls,
        "env_steps_per_s": calls * num_envs / elapsed,
        "copied_share": adder.copied_rows / max(1, adder.appended_rows),
        "items": table.size,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--env-steps",
        type=int,
        default=60_000,
        help="environment steps fed per configuration (6 configurations)",
    )
    args = p.parse_args(argv)
    if args.env_steps < 64:
        p.error(f"--env-steps {args.env_steps} must be at least 64 (one step of 64 envs)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rows = [run(n, c, args.env_steps) for n in (1, 8, 64) for c in (16, 64)]
    for per_call in (False, True):
        rows += [run(16, c, args.env_steps, (10, 35), per_call) for c in (16, 64)]
    print(
        f"{'envs':>5s} {'chunk':>6s} {'episode':>8s} {'path':>9s} {'steps/s':>10s} "
        f"{'copied':>7s} {'chunks/call':>12s}"
    )
    for r in rows:
        lo, hi = r["episode_steps"]
        print(
            f"{r['num_envs']:5d} {r['chunk_length']:6d} {f'{lo}-{hi}':>8s} {r['path']:>9s} "
            f"{r['env_steps_per_s']:10.0f} {r['copied_share']:7.1%} {r['chunks_per_call']:12.2f}"
        )
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_adders.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
