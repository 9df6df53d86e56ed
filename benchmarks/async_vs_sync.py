"""Acting and learning in parallel against the synchronous loop: speed and learning.

Run from the repository root (one command; every run is its own process)::

    python -m benchmarks.async_vs_sync [--workloads dqn,sac,sac-costly,sac-costly-native]
        [--backends inline,threads,processes] [--seeds 5] [--steps-scale 1.0]
        [--sweep 0.25,1,4,16] [--sweep-seeds 3] [--sweep-steps 5000]

Workloads (the examples' own files, flags and evaluations, as a user runs them):

- ``dqn``: ``examples/dqn_cartpole.py``, CartPole-v1, 50k env steps;
- ``sac``: ``examples/sac_continuous.py``, Pendulum-v1, 20k env steps;
- ``sac-costly``: the same SAC on Pendulum-v1 whose every step first spends
  ``--step-cost-ms`` of CPU time in Python (:mod:`benchmarks.costly_env`: an environment
  made slower by design, so acting costs about as much as learning), 10k env steps;
- ``sac-costly-native``: the same, the step's time spent instead inside MuJoCo's
  ``mj_step`` (a simulator in C, which releases the interpreter lock as MuJoCo does).

For each workload the same seeds run on every backend, alternating (seed 1 on each backend,
then seed 2, ...), at the same ratio of updates to env steps, held by the table's limiter.
Reported per workload and backend:

- learning per env step: each run's evaluations interpolated on the evaluation grid, the
  mean curve with a 95% interval over seeds, the area under each run's curve (its mean
  evaluation return over the run), and against ``inline`` a two-sided Welch t-test on the
  areas and the relative difference of their means (the backends agree when the test does
  not reject at 0.05 and the means differ by less than 10%);
- speed: the run's wall time to the same env steps (median over seeds, and the median of
  the per-seed ratios to ``inline``), ``t_act`` (the actor alone: the example's policy,
  env and adder writing into a table that never blocks, no learner) and ``t_learn`` (the
  learner alone: the example's update on batches sampled from that table, as many as the
  run makes), the ideal speed-up of two overlapping loops
  ``(t_act + t_learn) / max(t_act, t_learn)`` and the achieved one. No backend can learn
  before the table holds ``min_size_to_sample`` items, so acting alone fills it first
  (``t_fill``, the actor's time for that share of its steps); beside the ideal the table
  gives the ideal after that fill, ``(t_act + t_learn) / (t_fill + max(t_act - t_fill,
  t_learn))``. Evaluations run in an
  evaluator process of their own on every backend: ``inline`` waits for them in its one
  loop, the others overlap them too, so beside the ideal the table gives ``t_eval`` (the
  inline runs' evaluation time, median) and the ideal of three overlapping parts on this
  machine's cores, ``(t_act + t_learn + t_eval) / max(t_act, t_learn, t_eval,
  (t_act + t_learn + t_eval) / cores)``;
- the ratio held: observed samples per insert in every 10 s window after the table
  reached ``min_size_to_sample`` (the largest deviation from the target, in %);
- the actors' policy lag (learner updates since the weights an actor acts with were
  published: weight staleness) and, separately, the age of sampled data (versions).

``--sweep`` adds SAC on the costly Pendulum at several ratios (updates per env step) on
the processes backend: final return and wall time against the ratio the user sets and the
table holds.

Prints tables and writes ``benchmarks/results/async_vs_sync.json`` and one figure per
workload (``async_vs_sync_<workload>.png``: return against env steps and against seconds,
``inline`` against the default parallel backend). Nothing else should run on the machine:
the parallel backends need both cores.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
WINDOW_S = 10.0
SWEEP_BACKEND = "processes"  # the fastest here where acting is costly


@dataclass(frozen=True)
class Workload:
    """One example run as a user runs it, with its own flags."""

    module: str
    steps: int
    target: float
    flags: tuple[str, ...] = ()
    costly_env: str | None = None  # gymnasium id whose steps are made costly
    cost: str = "python"  # how a costly step spends its time (benchmarks.costly_env.COSTS)


WORKLOADS = {
    "dqn": Workload("examples.dqn_cartpole", 50_000, 475.0),
    "sac": Workload("examples.sac_continuous", 20_000, -200.0),
    "sac-costly": Workload("examples.sac_continuous", 10_000, -200.0, costly_env="Pendulum-v1"),
    "sac-costly-native": Workload(
        "examples.sac_continuous", 10_000, -200.0, costly_env="Pendulum-v1", cost="native"
    ),
}


class _Captured(Exception):
    """Raised by the stand-in of ``rt.run`` that records the example's arguments."""


def _run_arguments(workload: Workload, argv: list[str]) -> tuple[Any, dict[str, Any]]:
    """The arguments the example passes to ``rlreplay.runtime.run`` (nothing runs)."""
    import rlreplay.runtime as rt

    module = importlib.import_module(workload.module)
    seen: dict[str, Any] = {}

    def capture(config: Any, **kwargs: Any) -> Any:
        seen.update(kwargs, config=config)
        raise _Captured

    real, rt.run = rt.run, capture
    try:
        module.main(argv)
    except _Captured:
        pass
    finally:
        rt.run = real
    return module, seen


def _example_argv(workload: Workload, backend: str, seed: int, steps: int, out: str,
                  extra: list[str]) -> list[str]:
    return ["--seed", str(seed), "--total-steps", str(steps), "--backend", backend,
            "--out", out, "--no-progress", *workload.flags, *extra]


def _env_of(workload: Workload, make_env: Any, step_cost_s: float) -> Any:
    """The example's ``make_env``, or for a costly workload the same number of envs of
    ``workload.costly_env`` whose steps each spend ``step_cost_s`` of CPU time."""
    if workload.costly_env is None:
        return make_env
    from benchmarks.costly_env import make_costly_vec

    return functools.partial(make_costly_vec, env_id=workload.costly_env,
                             num_envs=make_env.keywords.get("num_envs", 1), cost_s=step_cost_s,
                             cost=workload.cost)


def one_run(workload: Workload, backend: str, seed: int, steps: int, extra: list[str],
            step_cost_s: float) -> dict[str, Any]:
    """Run the example once (in this process) and return its rows and summary."""
    import rlreplay.runtime as rt

    module = importlib.import_module(workload.module)
    captured: dict[str, Any] = {}
    real = rt.run
    eval_s = [0.0]

    def run(config: Any, **kwargs: Any) -> Any:
        kwargs["make_env"] = _env_of(workload, kwargs["make_env"], step_cost_s)
        on_stats = kwargs.get("on_stats")
        if on_stats is not None:
            def timed(row: dict, weights: Any) -> Any:
                start = time.perf_counter()
                try:
                    return on_stats(row, weights)
                finally:
                    eval_s[0] += time.perf_counter() - start

            kwargs["on_stats"] = timed
        result = real(config, **kwargs)
        captured.update(rows=result.rows, run_summary=result.summary,
                        ratio=config.ratio, batch_size=config.batch_size,
                        min_size=config.min_size_to_sample)
        return result

    rt.run = run
    try:
        with tempfile.TemporaryDirectory() as out:
            summary = module.main(_example_argv(workload, backend, seed, steps, out, extra))
    finally:
        rt.run = real
    return {
        "backend": backend, "seed": seed, "summary": summary, "rows": captured["rows"],
        "run_summary": captured["run_summary"], "ratio": captured["ratio"],
        "min_size": captured["min_size"], "eval_s": eval_s[0],
    }


def parts_alone(workload: Workload, seed: int, steps: int, updates: int, extra: list[str],
                step_cost_s: float, max_updates_timed: int = 3_000) -> dict[str, float]:
    """``t_act``: the example's actor alone for ``steps`` env steps into a table that
    never blocks; ``t_learn``: the example's learner alone for ``updates`` updates on
    batches sampled from that table (timed over at most ``max_updates_timed`` and scaled)."""
    import rlreplay as rr
    from rlreplay.runtime.actor import NUM_COUNTERS
    from rlreplay.runtime.config import build_table
    from rlreplay.runtime.environment_loop import ActorRecipe
    from rlreplay.runtime.learner import Learner
    from rlreplay.runtime.weights import Weights

    _, args = _run_arguments(workload, _example_argv(workload, "inline", seed, steps, "", extra))
    config, replay = args["config"], args["replay"]
    make_env = _env_of(workload, args["make_env"], step_cost_s)
    capacity = build_table(config, replay).store.capacity
    table = rr.Table(  # the run's table, but its limiter never makes the actor wait
        replay.name, signature=replay.signature, capacity=capacity,
        layout=replay.layout, sampler=replay.sampler or rr.Uniform(), remover=rr.Fifo(),
        max_size=replay.max_size, rate_limiter=rr.MinSize(1), seed=config.seed,
    )
    weights = Weights()
    logic = args["learner"]
    weights.publish(logic.params())
    recipe = ActorRecipe(config, make_env, args["make_policy"], replay.adder, steps)
    counters = np.zeros(NUM_COUNTERS)
    loop = recipe.build(0, table, weights, counters, threading.Event())
    start = time.perf_counter()
    loop.run()  # to the quota, everything handed over, the env closed
    t_act = time.perf_counter() - start
    learner = Learner(logic, table, weights, config)
    timed = max(1, min(updates, max_updates_timed))
    start = time.perf_counter()
    for _ in range(timed):
        learner.update(table.sample(config.batch_size, timeout=10.0))
    t_learn = (time.perf_counter() - start) * updates / timed
    return {"t_act": t_act, "t_learn": t_learn, "updates": updates,
            "updates_timed": timed}


# ---------------------------------------------------------------- analysis
def eval_curve(rows: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(env_steps, wall_s, eval_return) of the rows that carry an evaluation."""
    points = [(r["env_steps"], r["wall_s"], r["eval_return"]) for r in rows
              if isinstance(r.get("eval_return"), (int, float))
              and np.isfinite(r["eval_return"])]
    if not points:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    steps, wall, ret = (np.asarray(x, dtype=np.float64) for x in zip(*points))
    return steps, wall, ret


def area(steps: np.ndarray, returns: np.ndarray, total: int) -> float:
    """Mean evaluation return over ``[0, total]`` env steps (trapezoids; flat to the ends)."""
    grid = np.linspace(0, total, 201)
    return float(np.mean(np.interp(grid, steps, returns)))


def interval95(values: np.ndarray) -> tuple[float, float]:
    """Mean and half-width of a 95% t interval over the first axis."""
    from scipy import stats

    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    mean = values.mean(axis=0)
    if n < 2:
        return mean, np.zeros_like(mean)
    half = stats.t.ppf(0.975, n - 1) * values.std(axis=0, ddof=1) / np.sqrt(n)
    return mean, half


def ratio_windows(run: dict) -> list[float]:
    """Observed samples per insert in each whole ``WINDOW_S`` window after the table
    reached its minimum size (the warm-up and the draining end left out)."""
    rows = [r for r in run["rows"] if r.get("items_sampled", 0) > 0 and not r.get("final")]
    if len(rows) < 2:
        return []
    out = []
    first = rows[0]
    for row in rows[1:]:
        if row["wall_s"] - first["wall_s"] >= WINDOW_S:
            inserted = row["items_inserted"] - first["items_inserted"]
            sampled = row["items_sampled"] - first["items_sampled"]
            if inserted > 0:
                out.append(sampled / inserted)
            first = row
    return out


def mean_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))
              and np.isfinite(r[key])]
    return float(np.mean(values)) if values else None


def analyse(name: str, workload: Workload, runs: list[dict], parts: dict[str, float],
            steps: int) -> dict[str, Any]:
    from scipy import stats

    by_backend: dict[str, list[dict]] = {}
    for run in runs:
        by_backend.setdefault(run["backend"], []).append(run)
    inline = {r["seed"]: r for r in by_backend.get("inline", [])}
    t_act, t_learn = parts["t_act"], parts["t_learn"]
    ideal = (t_act + t_learn) / max(t_act, t_learn)
    # No backend can learn before the table holds min_size items: acting alone fills it
    # (t_fill), then the two loops overlap.
    t_fill = t_act * min(1.0, runs[0]["min_size"] / steps)
    ideal_fill = (t_act + t_learn) / (t_fill + max(t_act - t_fill, t_learn))
    evals = [r["eval_s"] for r in by_backend.get("inline", [])]
    t_eval = statistics.median(evals) if evals else 0.0
    total = t_act + t_learn + t_eval
    ideal_eval = total / max(t_act, t_learn, t_eval, total / (os.cpu_count() or 1))
    areas_inline = [area(*eval_curve(r["rows"])[::2], steps) for r in inline.values()]
    out: dict[str, Any] = {"workload": name, "module": workload.module, "steps": steps,
                           "t_act_s": t_act, "t_learn_s": t_learn, "ideal_speedup": ideal,
                           "t_fill_s": t_fill, "ideal_speedup_after_fill": ideal_fill,
                           "t_eval_s": t_eval, "ideal_speedup_with_eval": ideal_eval,
                           "backends": {}}
    for backend, group in by_backend.items():
        walls = [r["rows"][-1]["wall_s"] for r in group]
        areas = [area(*eval_curve(r["rows"])[::2], steps) for r in group]
        paired = [inline[r["seed"]]["rows"][-1]["wall_s"] / r["rows"][-1]["wall_s"]
                  for r in group if r["seed"] in inline]
        windows = [w for r in group for w in ratio_windows(r)]
        target = group[0]["ratio"]
        deviation = (max(abs(w / target - 1.0) for w in windows) * 100
                     if windows and target else None)
        entry: dict[str, Any] = {
            "seeds": [r["seed"] for r in group],
            "wall_s": walls,
            "wall_s_median": statistics.median(walls),
            "speedup_vs_inline": statistics.median(paired) if paired else None,
            "eval_s": [r["eval_s"] for r in group],
            "final_eval": [r["summary"].get("final_eval_return") for r in group],
            "best_eval": [r["summary"].get("best_eval_return") for r in group],
            "area": areas,
            "area_mean": float(np.mean(areas)),
            "ratio_target": target,
            "ratio_windows": len(windows),
            "ratio_max_deviation_pct": deviation,
            "policy_lag_mean_updates": mean_of(
                [row for r in group for row in r["rows"]], "policy_lag_mean"),
            "sample_age_mean_versions": mean_of(
                [row for r in group for row in r["rows"]], "sample_age_mean"),
        }
        if backend != "inline" and len(areas) >= 2 and len(areas_inline) >= 2:
            test = stats.ttest_ind(areas, areas_inline, equal_var=False)
            base = float(np.mean(areas_inline))
            entry["area_p_value"] = float(test.pvalue)
            entry["area_rel_diff"] = abs(float(np.mean(areas)) - base) / max(abs(base), 1e-9)
            entry["learns_as_inline"] = bool(test.pvalue >= 0.05 and entry["area_rel_diff"] < 0.1)
        if entry["speedup_vs_inline"] is not None and backend != "inline":
            entry["fraction_of_ideal"] = entry["speedup_vs_inline"] / ideal
            entry["fraction_of_ideal_after_fill"] = entry["speedup_vs_inline"] / ideal_fill
        out["backends"][backend] = entry
    return out


def figure(name: str, runs: list[dict], steps: int, backends: list[str], path: Path) -> None:
    """Return against env steps and against seconds, mean and 95% interval over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    grid = np.linspace(0, steps, 101)
    for backend in backends:
        group = [r for r in runs if r["backend"] == backend]
        if not group:
            continue
        curves, times = [], []
        for r in group:
            s, w, ret = eval_curve(r["rows"])
            curves.append(np.interp(grid, s, ret))
            times.append(np.interp(grid, s, w))
        mean, half = interval95(np.asarray(curves))
        seconds = np.median(np.asarray(times), axis=0)
        label = f"{backend} ({len(group)} seeds)"
        for axis, x in ((left, grid), (right, seconds)):
            axis.plot(x, mean, label=label)
            axis.fill_between(x, mean - half, mean + half, alpha=0.2)
    left.set_xlabel("env steps")
    right.set_xlabel("seconds (median over seeds)")
    for axis in (left, right):
        axis.set_ylabel("evaluation return")
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(f"{name}: mean and 95% interval over seeds ({platform.node() or 'host'}, "
                 f"{os.cpu_count()} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- driver
def _child(args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``python -m benchmarks.async_vs_sync --child ...`` and return its JSON."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        subprocess.run([sys.executable, "-m", "benchmarks.async_vs_sync", "--child", path,
                        *args], cwd=ROOT, check=True, timeout=timeout)
        return json.loads(Path(path).read_text())
    finally:
        os.unlink(path)


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("what", choices=("run", "parts"))
    parser.add_argument("workload")
    parser.add_argument("backend")
    parser.add_argument("seed", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("--updates", type=int, default=0)
    parser.add_argument("--step-cost-ms", type=float, default=0.0)
    parser.add_argument("--extra", default="")
    a = parser.parse_args(argv)
    workload = WORKLOADS[a.workload]
    extra = a.extra.split()
    cost = a.step_cost_ms / 1e3
    if a.what == "run":
        result = one_run(workload, a.backend, a.seed, a.steps, extra, cost)
    else:
        result = parts_alone(workload, a.seed, a.steps, a.updates, extra, cost)
    Path(a.child).write_text(json.dumps(result, default=_plain))


def _plain(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child_main(argv)
        return {}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="dqn,sac,sac-costly")
    parser.add_argument("--backends", default="inline,threads,processes")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N on every backend")
    parser.add_argument("--steps-scale", type=float, default=1.0,
                        help="multiply every workload's env steps (0.2: a short check)")
    parser.add_argument("--step-cost-ms", type=float, default=3.0,
                        help="CPU time each step of sac-costly(-native) spends before stepping")
    parser.add_argument("--sweep", default="", help="updates per env step, e.g. 0.25,1,4,16")
    parser.add_argument("--sweep-seeds", type=int, default=3)
    parser.add_argument("--sweep-steps", type=int, default=5_000)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--out", default=str(RESULTS / "async_vs_sync.json"))
    a = parser.parse_args(argv)
    backends = a.backends.split(",")
    load = os.getloadavg()[0]
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "load_at_start": load},
        "settings": vars(a), "workloads": [], "sweep": [],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    cost = ["--step-cost-ms", str(a.step_cost_ms)]
    for name in a.workloads.split(","):
        workload = WORKLOADS[name]
        steps = max(1_000, int(workload.steps * a.steps_scale))
        runs = []
        for seed in range(1, a.seeds + 1):
            for backend in backends:
                start = time.perf_counter()
                run = _child(["run", name, backend, str(seed), str(steps), *cost], a.timeout)
                runs.append(run)
                print(f"{name:10s} {backend:9s} seed {seed}: wall {run['rows'][-1]['wall_s']:7.1f}"
                      f" s (process {time.perf_counter() - start:5.1f} s), final eval "
                      f"{run['summary'].get('final_eval_return')}", flush=True)
        updates = int(statistics.median(
            r["run_summary"]["updates"] for r in runs if r["backend"] == backends[0]))
        parts = _child(["parts", name, "inline", "1", str(steps), "--updates", str(updates),
                        *cost], a.timeout)
        result = analyse(name, workload, runs, parts, steps)
        result["runs"] = [{k: v for k, v in r.items() if k != "rows"} | {
            "curve": [list(x) for x in zip(*(c.tolist() for c in eval_curve(r["rows"])))]}
            for r in runs]
        report["workloads"].append(result)
        figure(name, runs, steps, backends, RESULTS / f"async_vs_sync_{name}.png")
        print_workload(result)
    if a.sweep:
        for ratio in a.sweep.split(","):
            for seed in range(1, a.sweep_seeds + 1):
                extra = f"--updates-per-env-step {ratio}"
                run = _child(["run", "sac-costly", SWEEP_BACKEND, str(seed),
                              str(a.sweep_steps), *cost, "--extra", extra], a.timeout)
                report["sweep"].append({
                    "updates_per_env_step": float(ratio), "seed": seed,
                    "final_eval": run["summary"].get("final_eval_return"),
                    "wall_s": run["rows"][-1]["wall_s"],
                    "updates": run["run_summary"]["updates"],
                    "samples_per_insert_observed":
                        run["run_summary"]["samples_per_insert_observed"],
                    "samples_per_insert_target": run["ratio"],
                })
                print(f"sweep {ratio:>5s} seed {seed}: {report['sweep'][-1]}", flush=True)
        print_sweep(report["sweep"])
    report["machine"]["load_at_end"] = os.getloadavg()[0]
    Path(a.out).write_text(json.dumps(report, indent=1, default=_plain))
    print(f"wrote {a.out}")
    return report


def print_workload(result: dict[str, Any]) -> None:
    print(f"\n{result['workload']}: {result['steps']} env steps; actor alone "
          f"{result['t_act_s']:.1f} s, learner alone {result['t_learn_s']:.1f} s, ideal "
          f"speed-up {result['ideal_speedup']:.2f}x (after acting alone fills the table "
          f"to min_size, {result['t_fill_s']:.1f} s: {result['ideal_speedup_after_fill']:.2f}x)"
          f"; inline's evaluations {result['t_eval_s']:.1f} s, ideal with them overlapped "
          f"{result['ideal_speedup_with_eval']:.2f}x")
    print(f"{'backend':10s} {'wall s':>8s} {'speed-up':>9s} {'of ideal':>9s} {'area':>9s} "
          f"{'p':>6s} {'diff':>6s} {'spi dev%':>9s} {'lag upd':>8s} {'age ver':>8s}  final")
    for backend, e in result["backends"].items():
        f = functools.partial(_fmt, e)

        print(f"{backend:10s} {e['wall_s_median']:8.1f} {f('speedup_vs_inline', '9.2f')} "
              f"{f('fraction_of_ideal', '9.2f')} {e['area_mean']:9.1f} "
              f"{f('area_p_value', '6.2f')} {f('area_rel_diff', '6.1%')} "
              f"{f('ratio_max_deviation_pct', '9.1f')} {f('policy_lag_mean_updates', '8.1f')} "
              f"{f('sample_age_mean_versions', '8.1f')}  {e['final_eval']}")


def _fmt(entry: dict[str, Any], key: str, fmt: str) -> str:
    value = entry.get(key)
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def print_sweep(sweep: list[dict]) -> None:
    print(f"\nratio sweep (sac-costly, {SWEEP_BACKEND})")
    print(f"{'updates/step':>12s} {'final eval (mean)':>18s} {'wall s (median)':>16s}")
    for ratio in sorted({s["updates_per_env_step"] for s in sweep}):
        group = [s for s in sweep if s["updates_per_env_step"] == ratio]
        finals = [s["final_eval"] for s in group if s["final_eval"] is not None]
        print(f"{ratio:12.2f} {np.mean(finals) if finals else float('nan'):18.1f} "
              f"{statistics.median(s['wall_s'] for s in group):16.1f}")


if __name__ == "__main__":
    main()
