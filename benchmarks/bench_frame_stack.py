"""Frame stacks without duplication: memory per stored step and sampling rate vs cpprb.

100k steps of uint8[84, 84] frames in episodes of random length, served as stacks of 4
with 1-step transitions (obs and next_obs each ``[4, 84, 84]``). rlreplay stores one
frame per step (NStepTransitionAdder(stack=4)); cpprb uses ``next_of="obs"`` and
``stack_compress="obs"``. Both sample uniformly, 256 transitions per batch, in the same
run.

Memory is what ``tracemalloc`` sees allocated by construction and the first step (both
preallocate their buffers; numpy allocations included) divided by the steps the run
adds; fill times are measured afterwards without tracing.

Run: ``python benchmarks/bench_frame_stack.py`` (``--steps`` to shrink). Prints a table
and writes JSON to benchmarks/results/bench_frame_stack.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlreplay import NStepTransitionAdder, Table

FRAME = (84, 84)
STACK = 4


def episode_lengths(steps: int, rng: np.random.Generator) -> list[int]:
    out, total = [], 0
    while total < steps:
        n = int(min(rng.integers(200, 2000), steps - total))
        out.append(n)
        total += n
    return out


def frame_pool(rng: np.random.Generator, size: int = 512) -> np.ndarray:
    return rng.integers(0, 256, size=(size, *FRAME), dtype=np.uint8)


def fill_rlreplay(steps: int, lengths: list[int], pool: np.ndarray) -> tuple[Table, float, int]:
    sig = NStepTransitionAdder.signature(obs=(FRAME, "uint8"), action="int64")
    capacity = steps + STACK * len(lengths)  # every step plus pad and final rows
    tracemalloc.start()
    table = Table(
        "frames",
        signature=sig,
        capacity=capacity,
        layout=NStepTransitionAdder.layout(sig, n=1, stack=STACK),
        seed=0,
    )
    adder = NStepTransitionAdder(table, n=1, discount=0.99, stack=STACK)
    adder.reset(pool[0])
    adder.add(0, 1.0, pool[1], False, False)
    nbytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    adder.end_episode(terminated=False)
    table.store.reset()
    start = time.perf_counter()
    t = 0
    for length in lengths:
        adder.reset(pool[t % len(pool)])
        for k in range(length):
            t += 1
            adder.add(k % 6, 1.0, pool[t % len(pool)], k == length - 1, False)
    return table, time.perf_counter() - start, nbytes


def fill_cpprb(steps: int, lengths: list[int], pool: np.ndarray):
    from cpprb import ReplayBuffer

    tracemalloc.start()
    rb = ReplayBuffer(
        steps,
        {
            "obs": {"shape": (*FRAME, STACK), "dtype": np.uint8},
            "act": {"dtype": np.int64},
            "rew": {},
            "done": {},
        },
        next_of="obs",
        stack_compress="obs",
    )
    first = np.zeros((*FRAME, STACK), dtype=np.uint8)
    rb.add(obs=first, act=0, rew=0.0, next_obs=first, done=True)
    rb.on_episode_end()
    nbytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    rb.clear()
    start = time.perf_counter()
    t = 0
    stack = np.empty((*FRAME, STACK), dtype=np.uint8)
    for length in lengths:
        stack[:] = pool[t % len(pool)][..., None]
        for k in range(length):
            t += 1
            nxt = np.concatenate([stack[..., 1:], pool[t % len(pool)][..., None]], axis=-1)
            rb.add(obs=stack, act=k % 6, rew=1.0, next_obs=nxt, done=k == length - 1)
            stack = nxt
        rb.on_episode_end()
    return rb, time.perf_counter() - start, nbytes


def rate(fn, repeats: int) -> float:
    fn()
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = max(best, repeats / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths = episode_lengths(args.steps, rng)
    pool = frame_pool(rng)
    frame_bytes = int(np.prod(FRAME))

    table, ours_fill_s, ours_bytes = fill_rlreplay(args.steps, lengths, pool)
    ours_rate = rate(lambda: table.sample(args.batch), args.repeats)
    shape = table.sample(args.batch).data["obs"].shape
    rows = {
        "rlreplay": {
            "bytes_per_step": ours_bytes / args.steps,
            "store_bytes_per_step": table.store.nbytes / args.steps,
            "index_bytes_per_step": table.index_nbytes() / args.steps,
            "fill_s": ours_fill_s,
            "batches_per_s": ours_rate,
            "obs_shape": list(shape),
        }
    }
    try:
        rb, cpprb_fill_s, cpprb_bytes = fill_cpprb(args.steps, lengths, pool)
        cpprb_rate = rate(lambda: rb.sample(args.batch), args.repeats)
        rows["cpprb"] = {
            "bytes_per_step": cpprb_bytes / args.steps,
            "fill_s": cpprb_fill_s,
            "batches_per_s": cpprb_rate,
            "obs_shape": list(rb.sample(args.batch)["obs"].shape),
        }
    except ImportError:
        pass

    print(
        f"{args.steps} steps of uint8{list(FRAME)}, stack {STACK}, batch {args.batch}, "
        f"{len(lengths)} episodes; one frame = {frame_bytes} B"
    )
    print(f"{'impl':10s} {'B/step':>9s} {'x frame':>8s} {'fill s':>8s} {'batch/s':>9s}  obs")
    for name, r in rows.items():
        print(
            f"{name:10s} {r['bytes_per_step']:9.0f} {r['bytes_per_step'] / frame_bytes:8.3f} "
            f"{r['fill_s']:8.2f} {r['batches_per_s']:9.1f}  {r['obs_shape']}"
        )
    if "cpprb" in rows:
        ratio = rows["rlreplay"]["batches_per_s"] / rows["cpprb"]["batches_per_s"]
        print(f"rlreplay / cpprb sampling rate: {ratio:.2f}x")
        rows["ratio_vs_cpprb"] = ratio
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    rows["config"] = {
        **vars(args),
        "episodes": len(lengths),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    (out / "bench_frame_stack.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
