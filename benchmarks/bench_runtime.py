"""Actor-learner runtime: actor-loop overhead, ratio fidelity, learner throughput.

Run from the repository root::

    python -m benchmarks.bench_runtime [--quick] [--duration S] [--window S]
                                       [--backends inline,threads,processes]

Workload: CartPole-v1, ``gym.make_vec(..., num_envs=16, vectorization_mode="sync")``, a
numpy random policy, an n-step (n=3) transition adder, a uniform table and a learner whose
update is one SGD step of a small numpy Q-network (4 -> 256 -> 256 -> 2, about 1 ms at batch 64
on one core; BLAS limited to one thread). Three parts:

1. ``actor``: env steps/s of the raw vector env (``envs.step(random actions)``) against the
   runtime's :class:`~rlreplay.runtime.actor.Actor` loop writing through the adder into a
   table whose limiter never blocks (``MinSize(1)``, no learner), against the same loop
   with an adder whose calls do nothing (the actor's own cost), and with the n-step adder
   on its per-call path (what it did before it recorded its calls in blocks, see
   :mod:`rlreplay.writers.nstep_blocks`; still the path of sequence tables and large rows).
   Rounds of the four loops alternate: steps/s is the best round, the ratio to raw the
   median of the ratios within a round. Target: the actor loop keeps >= 80% of the raw
   env's steps/s.
2. ``ratio``: for each backend and each ``samples_per_insert`` target, one ``rt.run`` of
   about ``--duration`` seconds (its env steps are sized from a short probe run) with
   statistics rows every ``--window`` seconds. The first row (warm-up: the table fills to
   ``min_size_to_sample``) and the last (partial, the learner draining) are dropped; every
   other row's observed samples per insert must be within +-10% of the target, with the
   runtime's default ``error_buffer``.
3. ``learner``: updates/s of the same update function in a plain loop on one fixed batch,
   through a prefetching :class:`~rlreplay.iterators.ReplayIterator` on a full table (no
   actors; rounds alternate with the plain loop), and through ``rt.run`` (threads backend,
   one update per env step, so the learner is the bottleneck) with actors writing while
   it learns. Best round (statistics row) of each: slower ones lost time to other
   processes on a shared machine.

Prints a table and writes ``benchmarks/results/bench_runtime.json``. The machine's load
average is recorded with the results: on a shared machine every figure is a lower bound.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

# The learner's update runs on one core (set before numpy loads BLAS; actor processes
# inherit it): on a shared 2-core machine a multithreaded BLAS only adds contention.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np

if __package__ in (None, ""):  # run as a script from a checkout: find the package beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rlreplay as rr
import rlreplay.runtime as rt
from rlreplay.core.rate_limiters import MinSize
from rlreplay.iterators import ReplayIterator
from rlreplay.runtime.actor import NUM_COUNTERS, Actor

NUM_ENVS = 16
N_STEP = 3
MAX_SIZE = 100_000
HIDDEN = 256
TOLERANCE = 0.10
PARTS = ("actor", "ratio", "learner")
ACTOR_TARGET = 0.80
SIGNATURE = rr.NStepTransitionAdder.signature(
    obs=((4,), "float32"), action="int64", extras={rt.POLICY_VERSION: "int64"}
)
RESULTS = Path(__file__).parent / "results" / "bench_runtime.json"


# ------------------------------------------------------------ the run's parts (picklable)
def make_env(seed: int = 0) -> Any:
    """CartPole-v1, a synchronous vector of ``NUM_ENVS``."""
    import gymnasium as gym

    return gym.make_vec("CartPole-v1", num_envs=NUM_ENVS, vectorization_mode="sync")


class RandomPolicy:
    """Uniform random actions from the actor's own seed; ignores weights."""

    def __init__(self, index: int = 0, num_actors: int = 1, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        pass

    def __call__(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        return self.rng.integers(2, size=len(obs))


class NullAdder:
    """An adder whose calls do nothing: what the actor loop costs without replay."""

    def __init__(self, writer: Any = None, num_envs: int = NUM_ENVS, **kwargs: Any):
        self.num_envs = num_envs

    def reset(self, obs: Any) -> None:
        pass

    def add(self, *args: Any, **kwargs: Any) -> None:
        pass

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass


class PerCallNStepAdder(rr.NStepTransitionAdder):
    """The n-step adder on its per-call path (each call's episodes cut as they end, as
    for sequence tables and large rows): the block path's before, measured beside it."""

    def _new_block(self, every: int) -> None:
        return None


class QLearner:
    """One SGD step of a 4-256-256-2 numpy Q-network on a Huber TD loss against a target
    network refreshed every 200 updates: about 1 ms per batch of 64 on one core."""

    def __init__(self, seed: int = 0, lr: float = 1e-3, target_every: int = 200):
        rng = np.random.default_rng(seed)
        shapes = {"w1": (4, HIDDEN), "w2": (HIDDEN, HIDDEN), "w3": (HIDDEN, 2)}
        self.w = {k: rng.normal(0, np.sqrt(2 / s[0]), s) for k, s in shapes.items()}
        self.target = self.params()
        self.lr = lr
        self.target_every = target_every
        self.updates = 0

    @staticmethod
    def _forward(w: dict, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h1 = np.maximum(obs @ w["w1"], 0.0)
        h2 = np.maximum(h1 @ w["w2"], 0.0)
        return h1, h2, h2 @ w["w3"]

    def update(self, batch: rr.Sample) -> None:
        d = batch.data
        obs = np.asarray(d["obs"], np.float64)
        h1, h2, q = self._forward(self.w, obs)
        _, _, q_next = self._forward(self.target, np.asarray(d["next_obs"], np.float64))
        target = d["reward"] + d["discount"] * q_next.max(axis=1)
        rows = np.arange(len(obs))
        grad_q = np.zeros_like(q)
        grad_q[rows, d["action"]] = np.clip(q[rows, d["action"]] - target, -1, 1) / len(obs)
        g2 = (grad_q @ self.w["w3"].T) * (h2 > 0)
        g1 = (g2 @ self.w["w2"].T) * (h1 > 0)
        self.w["w3"] -= self.lr * (h2.T @ grad_q)
        self.w["w2"] -= self.lr * (h1.T @ g2)
        self.w["w1"] -= self.lr * (obs.T @ g1)
        self.updates += 1
        if self.updates % self.target_every == 0:
            self.target = self.params()
        return None

    def params(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.w.items()}


def replay_spec() -> rt.ReplaySpec:
    return rt.ReplaySpec(
        signature=SIGNATURE,
        layout=rr.NStepTransitionAdder.layout(SIGNATURE, n=N_STEP),
        adder=functools.partial(rr.NStepTransitionAdder, n=N_STEP, discount=0.99),
        max_size=MAX_SIZE,
    )


def free_table() -> rr.Table:
    """The replay table with a limiter that never blocks (no learner samples it)."""
    spec = replay_spec()
    return rr.Table(
        "replay", signature=SIGNATURE, layout=spec.layout, max_size=MAX_SIZE,
        capacity=MAX_SIZE + 4096, rate_limiter=MinSize(1), seed=0,
    )


# ------------------------------------------------------------ 1. actor loop overhead
def _actor(adder: Any) -> rt.EnvironmentLoop:
    weights = rt.Weights()
    weights.publish({"w": np.zeros(1)})
    config = rt.RuntimeConfig(backend="threads", samples_per_insert=1.0, progress=False)
    counters, stop = np.zeros(NUM_COUNTERS), threading.Event()
    actor = Actor(0, RandomPolicy(0, 1, 0), adder, weights, config, NUM_ENVS, counters, stop)
    loop = rt.EnvironmentLoop(make_env(0), actor, 2**62, counters, stop, seed=0)
    loop.start()
    return loop


def _steps_per_s(step: Any, seconds: float) -> float:
    start = time.perf_counter()
    calls = 0
    while True:
        for _ in range(50):
            step()
        calls += 50
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls * NUM_ENVS / elapsed


def bench_actor(args: argparse.Namespace) -> dict:
    """Raw env, actor + adder + table, actor + null adder: steps/s (best round: the others
    lost time to other processes) and the ratio to the raw env (median over rounds of the
    ratio within a round: the three loops of a round run back to back under one load)."""
    envs = make_env(0)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)

    def raw() -> None:
        envs.step(rng.integers(2, size=NUM_ENVS))

    table = free_table()
    adder = rr.NStepTransitionAdder(table, num_envs=NUM_ENVS, n=N_STEP, discount=0.99,
                                    timeout=0.25)
    per_call = PerCallNStepAdder(free_table(), num_envs=NUM_ENVS, n=N_STEP, discount=0.99,
                                 timeout=0.25)
    loops = {"raw": raw, "actor+adder": _actor(adder).step, "actor (null adder)":
             _actor(NullAdder()).step, "actor+adder, per-call path": _actor(per_call).step}
    rounds: dict[str, list[float]] = {name: [] for name in loops}
    for step in loops.values():
        _steps_per_s(step, 0.2)  # warm-up
    for _ in range(args.rounds):
        for name, step in loops.items():
            rounds[name].append(_steps_per_s(step, args.actor_s))
    rows = []
    for name in loops:
        ratio = statistics.median(np.divide(rounds[name], rounds["raw"]).tolist())
        best = max(rounds[name])
        rows.append({"loop": name, "steps_per_s": best, "rounds": rounds[name],
                     "us_per_vector_step": NUM_ENVS / best * 1e6, "ratio_to_raw": ratio,
                     "pass": None if name in ("raw", "actor+adder, per-call path")
                     else bool(ratio >= ACTOR_TARGET)})
    envs.close()
    # The budget: what the loop may add to the raw env's vector step and stay at the target.
    raw_us = rows[0]["us_per_vector_step"]
    block = adder._block
    path = "per-call" if block is None else (
        "blocks, compiled plan" if block._plan is not None else "blocks, numpy plan")
    return {"target_ratio": ACTOR_TARGET, "items_inserted": table.info().inserts,
            "adder_path": path,
            "hand_over_every": adder._out.every, "adder_rows_appended": adder.appended_rows,
            "budget_us_per_vector_step": raw_us / ACTOR_TARGET - raw_us, "rows": rows}


# ------------------------------------------------------------ 2. ratio fidelity
def _config(case: dict, every: float) -> rt.RuntimeConfig:
    return rt.RuntimeConfig(
        backend=case["backend"], batch_size=case["batch_size"],
        samples_per_insert=case["samples_per_insert"], min_size_to_sample=case["min_size"],
        error_buffer=case["error_buffer"], stats_every_s=every, progress=False,
        timeout_s=case["timeout_s"],
    )


def _run(config: rt.RuntimeConfig, total: int) -> rt.RunResult:
    return rt.run(config, make_env=make_env, make_policy=RandomPolicy, learner=QLearner(),
                  replay=replay_spec(), total_env_steps=int(total))


def _probe_rate(case: dict, seconds: float) -> float:
    """Env steps/s of this case, measured over about ``seconds`` of a short run (from its
    first row with updates: process start-up and the first fill do not count)."""
    steps, rate = 4 * case["min_size"], 0.0
    for _ in range(4):
        rows = _run(_config(case, seconds / 8), steps).rows
        moving = [r for r in rows[:-1] if r["updates"] > 0] or rows
        first, last = moving[0], moving[-1]
        span = last["wall_s"] - first["wall_s"]
        if span > 0:
            rate = (last["env_steps"] - first["env_steps"]) / span
            if span >= seconds / 2:
                return rate
            steps = int(min(steps * 16, max(steps * 2, rate * seconds * 1.2)))
        else:
            steps *= 4
    return rate or last["env_steps"] / max(last["wall_s"], 1e-3)


def ratio_case(args: argparse.Namespace, case: dict) -> dict:
    """Run one case of about ``args.duration`` seconds; its windows against the target."""
    spi = case["samples_per_insert"]
    try:
        rate = _probe_rate(case, args.probe_s)
        result = _run(_config(case, args.window), int(rate * args.duration) + case["min_size"])
    except Exception as error:  # reported in the table, the other cases go on
        case.update(status="ERROR", error=f"{type(error).__name__}: {error}")
        return case
    windows = [r["samples_per_insert"] for r in result.rows[1:-1]]
    ok = bool(windows) and all(abs(w / spi - 1.0) <= TOLERANCE for w in windows)
    summary = result.summary
    case.update(
        status="PASS" if ok else ("FAIL" if windows else "TOO SHORT"),
        env_steps=summary["env_steps"], wall_s=summary["wall_s"], updates=summary["updates"],
        env_steps_per_s=summary["env_steps"] / max(summary["wall_s"], 1e-9),
        updates_per_s=summary["updates"] / max(summary["wall_s"], 1e-9),
        windows=windows,
        window_min=min(windows) if windows else None,
        window_max=max(windows) if windows else None,
        observed_total=summary["samples_per_insert_observed"],
        learner_wait_frac=statistics.mean(r["learner_wait_frac"] for r in result.rows),
        actor_blocked_frac=statistics.mean(r["actor_blocked_frac"] for r in result.rows),
    )
    return case


def bench_ratio(args: argparse.Namespace) -> list[dict]:
    """One run per (backend, samples_per_insert) with the runtime's default limiter buffer."""
    out = []
    for backend in args.backends:
        for spi in args.spi:
            spec = {"backend": backend, "samples_per_insert": spi, "batch_size": args.batch,
                    "min_size": args.min_size, "error_buffer": None, "timeout_s": args.timeout}
            case = ratio_case(args, dict(spec))
            out.append(case)
            _say(case)
    return out


def _say(case: dict) -> None:
    head = (f"ratio {case['backend']:<9} spi {case['samples_per_insert']:<5g} "
            f"error_buffer {case['error_buffer']}: {case['status']}")
    if case["status"] == "ERROR":
        print(f"{head} {case['error'][:300]}", flush=True)
    else:
        print(f"{head}, {len(case['windows'])} windows, min {case['window_min']}, "
              f"max {case['window_max']}", flush=True)


# ------------------------------------------------------------ 3. learner throughput
def _filled_table(n: int) -> rr.Table:
    table = free_table()
    adder = rr.NStepTransitionAdder(table, num_envs=NUM_ENVS, n=N_STEP, discount=0.99)
    envs = make_env(0)
    obs, _ = envs.reset(seed=0)
    adder.reset(obs)
    rng = np.random.default_rng(0)
    extras = {rt.POLICY_VERSION: np.zeros(NUM_ENVS, np.int64)}
    while table.size < n:
        action = rng.integers(2, size=NUM_ENVS)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        adder.add(action, reward, next_obs, terminated, truncated, info, extras=extras)
    adder.flush()
    envs.close()
    return table


def _updates_per_s(update: Any, next_batch: Any, seconds: float) -> float:
    start = time.perf_counter()
    done = 0
    while True:
        for _ in range(5):
            update(next_batch())
        done += 5
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


def bench_learner(args: argparse.Namespace) -> list[dict]:
    """Updates/s of one update function: in a plain loop on a fixed batch and fed by a
    prefetching iterator over a full table (rounds alternate; best round), and inside
    ``rt.run`` (threads, one update per env step: actors write while it learns; best
    statistics row after the first). Best figures, because on a shared machine every
    slower round lost time to other processes, not to the code measured."""
    table = _filled_table(max(args.min_size * 4, 5_000 if args.quick else 20_000))
    out = []
    for batch in args.learner_batches:
        logic = QLearner()
        fixed = table.sample(batch)
        plain, sampled = [], []
        with ReplayIterator(table, batch, prefetch=2, timeout=10.0) as it:
            for _ in range(args.rounds):
                plain.append(_updates_per_s(logic.update, lambda f=fixed: f, args.learner_s))
                sampled.append(_updates_per_s(logic.update, it.__next__, args.learner_s))
        every = max(args.learner_s, 0.25)
        config = rt.RuntimeConfig(
            backend="threads", batch_size=batch, updates_per_env_step=1.0,
            min_size_to_sample=args.min_size, stats_every_s=every, progress=False,
        )
        total = int(max(plain) * every * (args.rounds + 1)) + args.min_size
        rows = rt.run(config, make_env=make_env, make_policy=RandomPolicy, learner=QLearner(),
                      replay=replay_spec(), total_env_steps=total).rows
        steady = [r for r in rows[1:-1] if r["updates"] > 0] or rows
        run = [r["updates_per_s"] for r in steady]
        best = {"plain": max(plain), "iterator": max(sampled), "run": max(run)}
        out.append({
            "batch_size": batch, "plain_updates_per_s": best["plain"],
            "iterator_updates_per_s": best["iterator"], "run_threads_updates_per_s": best["run"],
            "iterator_ratio": best["iterator"] / best["plain"],
            "run_ratio": best["run"] / best["plain"],
            "rounds": {"plain": plain, "iterator": sampled, "run_threads": run},
            "run_learner_wait_frac": statistics.mean(r["learner_wait_frac"] for r in steady),
            "run_actor_blocked_frac": statistics.mean(r["actor_blocked_frac"] for r in steady),
        })
    return out


# ------------------------------------------------------------ report
def _num(value: float | None) -> str:
    return f"{value:7.2f}" if value is not None else f"{'-':>7}"


def _print(result: dict) -> None:
    if "actor" in result:
        _print_actor(result)
    if "ratio" in result:
        _print_ratio(result)
    if "learner" in result:
        _print_learner(result)
    print(f"load average before/after: {result['load_before']} / {result['load_after']}")


def _print_actor(result: dict) -> None:
    print(f"\nactor loop, CartPole-v1 x{NUM_ENVS} sync, random policy "
          f"(target >= {ACTOR_TARGET:.0%} of raw)")
    print(f"{'loop':<28} {'steps/s':>10} {'us/step':>8} {'of raw':>7}  result")
    rows = result["actor"]["rows"]
    for r in rows:
        verdict = "" if r["pass"] is None else ("PASS" if r["pass"] else "FAIL")
        print(f"{r['loop']:<28} {r['steps_per_s']:10,.0f} {r['us_per_vector_step']:8.1f} "
              f"{r['ratio_to_raw']:6.0%}  {verdict}")
    raw_us = rows[0]["us_per_vector_step"]
    print(f"(us per vector step of {NUM_ENVS} envs, best rounds; the target allows "
          f"{result['actor']['budget_us_per_vector_step']:.1f} us over the raw env's "
          f"{raw_us:.1f}; the adder stages rows for "
          f"{result['actor']['hand_over_every']} vector steps, its path: "
          f"{result['actor']['adder_path']})")


def _print_ratio(result: dict) -> None:
    print(f"\nratio fidelity (every {result['args']['window']:g} s window after warm-up "
          f"within +-{TOLERANCE:.0%} of the target)")
    print(f"{'backend':<10} {'spi':>4} {'buffer':>7} {'wall s':>7} {'steps/s':>9} {'upd/s':>7} "
          f"{'windows':>7} {'min':>7} {'max':>7} {'total':>7}  result")
    for c in result["ratio"]:
        buffer = "default" if c["error_buffer"] is None else f"{c['error_buffer']:.0f}"
        head = f"{c['backend']:<10} {c['samples_per_insert']:>4g} {buffer:>7}"
        if c["status"] == "ERROR":
            print(f"{head}  ERROR: {c['error'][:100]}")
            continue
        print(f"{head} {c['wall_s']:7.1f} {c['env_steps_per_s']:9,.0f} "
              f"{c['updates_per_s']:7,.0f} {len(c['windows']):>7} {_num(c['window_min'])} "
              f"{_num(c['window_max'])} {_num(c['observed_total'])}  {c['status']}")


def _print_learner(result: dict) -> None:
    print("\nlearner updates/s (same update function)")
    print(f"{'batch':>5} {'plain':>8} {'iterator':>9} {'rt.run threads':>15} "
          f"{'iter/plain':>11} {'run/plain':>10} {'learner wait':>13}")
    for r in result["learner"]:
        print(f"{r['batch_size']:>5} {r['plain_updates_per_s']:8,.0f} "
              f"{r['iterator_updates_per_s']:9,.0f} {r['run_threads_updates_per_s']:15,.0f} "
              f"{r['iterator_ratio']:10.0%} {r['run_ratio']:10.0%} "
              f"{r['run_learner_wait_frac']:12.0%}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="short runs (about 2 minutes)")
    p.add_argument("--duration", type=float, default=None, help="seconds per ratio run (60)")
    p.add_argument("--window", type=float, default=None, help="ratio window in s (10)")
    p.add_argument("--backends", default="inline,threads,processes")
    p.add_argument("--parts", default=",".join(PARTS), help="which parts to run")
    p.add_argument("--spi", default="1,8,32", help="samples_per_insert targets")
    p.add_argument("--batch", type=int, default=64, help="batch size of the ratio runs")
    p.add_argument("--min-size", type=int, default=1_000, help="min_size_to_sample")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="timeout_s of the ratio runs: a deadlock shows as an error row after it")
    p.add_argument("--actor-s", type=float, default=None, help="seconds per actor round")
    p.add_argument("--rounds", type=int, default=None, help="actor rounds (5, quick 3)")
    p.add_argument("--learner-s", type=float, default=None, help="seconds per learner round")
    p.add_argument("--learner-batches", default=None, help="learner batch sizes (64,256)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    q = args.quick
    args.duration = args.duration or (10.0 if q else 60.0)
    args.window = args.window or (2.0 if q else 10.0)
    args.probe_s = min(3.0, args.duration / 4)
    args.actor_s = args.actor_s or (0.5 if q else 2.0)
    args.rounds = args.rounds or (3 if q else 5)
    args.learner_s = args.learner_s or (0.5 if q else 2.0)
    args.learner_batches = [int(b) for b in (args.learner_batches or
                                             ("64" if q else "64,256")).split(",")]
    args.backends = args.backends.split(",")
    unknown = set(args.backends) - set(("inline", "threads", "processes"))
    if unknown:
        p.error(f"unknown backends {sorted(unknown)}; choose from inline, threads, processes")
    args.spi = [float(s) for s in args.spi.split(",")]
    args.parts = args.parts.split(",")
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    load_before = os.getloadavg()
    started = time.time()
    result: dict[str, Any] = {
        "args": {k: v for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "rlreplay": rr.__version__},
        "load_before": [round(x, 2) for x in load_before],
    }
    parts = {"actor": bench_actor, "ratio": bench_ratio, "learner": bench_learner}
    for name in args.parts:
        result[name] = parts[name](args)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = time.time() - started
    _print(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
