"""Learning targets of the example agents, over seeds: the table the README shows.

Each (agent, seed) trains in its own process (``python examples/<agent>.py --seed S
--out DIR``), one at a time so wall times are comparable, and its ``summary.json`` is
read back. A run passes when its **final** evaluation (the mean greedy return of the
weights the run ends with, over the example's ``eval_episodes`` episodes, 20 by default)
reaches the target, and, for DQN, when the whole process took at most 60 s. The best
evaluation during the run and the env steps to the first evaluation at the target are
reported beside it, never in its place: an agent that reached 500 and then forgot does
not pass.

=========  ===================  =========  ===========  ==========  ============
agent      environment          target     env steps    wall        seeds needed
=========  ===================  =========  ===========  ==========  ============
dqn        CartPole-v1          >= 475     50,000       <= 60 s     10 of 10
sac        Pendulum-v1          >= -200    20,000                   10 of 10
ppo        CartPole-v1          >= 450     200,000                  5 of 5
apex       CartPole-v1          >= 475     50,000                   1 of 1
=========  ===================  =========  ===========  ==========  ============

The seeds are 1, 2, ... (``--first-seed``): never seed 0, the examples' own.

Run: ``python -m benchmarks.learning [--agents dqn sac] [--seeds 5] [--first-seed 100]
[--backend inline] [--quick]``. Prints one line per run and a table per agent, writes
``benchmarks/results/learning.json`` (every run's final and best evaluation, steps to
target, wall time, pass or fail) and one plot per agent with every seed's evaluation curve
(``docs/learning_<agent>.png``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# agent -> (example file, target return, env steps, wall budget s, seeds, extra args)
AGENTS = {
    "dqn": ("dqn_cartpole.py", 475.0, 50_000, 60.0, 10, []),
    "sac": ("sac_continuous.py", -200.0, 20_000, None, 10, []),
    "ppo": ("ppo_cartpole.py", 450.0, 200_000, None, 5, []),
    "apex": ("apex_dqn.py", 475.0, 50_000, None, 1, []),
}


def train(agent: str, seed: int, out: Path, quick: bool, backend: str | None) -> dict:
    """One training run in a fresh process; its summary plus the process's wall time."""
    script, _, steps, _, _, extra = AGENTS[agent]
    args = [sys.executable, str(ROOT / "examples" / script), "--seed", str(seed),
            "--out", str(out), "--no-progress", *extra]
    if backend:
        args += ["--backend", backend]
    if quick:
        args += ["--total-steps", str(max(1_000, steps // 20))]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, timeout=3_600)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The CPU seconds the run's processes used and the machine's load while it ran: on a
    # shared machine the wall time grows with the load, the CPU time much less.
    measured = {
        "seed": seed, "process_s": elapsed,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "load_avg_1m_end": os.getloadavg()[0],
    }
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"], **measured}
    summary = json.loads((out / "summary.json").read_text())
    summary.update(measured)
    return summary


def judge_run(agent: str, run: dict) -> dict:
    """Mark ``run`` passed when its final evaluation reaches the target (and, where the
    agent has a wall budget, the whole process took at most that long)."""
    _, target, steps, wall, _, _ = AGENTS[agent]
    final = run.get("final_eval_return")
    run["final_ok"] = final is not None and final >= target
    # The whole process counts (interpreter start, imports, evaluations), as `time`
    # would show a user; the run's own wall_s is reported beside it.
    run["time_ok"] = wall is None or (run.get("process_s") or float("inf")) <= wall
    run["passed"] = bool(run["final_ok"] and run["time_ok"] and "error" not in run
                         and (run.get("env_steps") or 0) >= steps)
    return run


def judge(agent: str, runs: list[dict]) -> dict:
    """Per agent: how many seeds ended at the target (within the wall budget)."""
    _, target, steps, wall, _, _ = AGENTS[agent]
    for r in runs:
        judge_run(agent, r)

    def values(key: str) -> list[float]:
        return [r[key] for r in runs if r.get(key) is not None]

    finals, bests = values("final_eval_return"), values("best_eval_return")
    walls, cpus = values("process_s"), values("cpu_s")
    return {
        "agent": agent, "target": target, "env_steps": steps, "wall_budget_s": wall,
        "seeds": len(runs), "passed": sum(r["passed"] for r in runs),
        "final_ok": sum(r["final_ok"] for r in runs),
        "time_ok": sum(r["time_ok"] for r in runs),
        "final_eval_mean": sum(finals) / len(finals) if finals else None,
        "final_eval_min": min(finals) if finals else None,
        "best_eval_min": min(bests) if bests else None,
        "process_s_median": sorted(walls)[len(walls) // 2] if walls else None,
        "process_s_max": max(walls) if walls else None,
        "cpu_s_median": sorted(cpus)[len(cpus) // 2] if cpus else None,
        "runs": runs,
    }


def plot(agent: str, outs: list[Path], target: float, path: Path) -> None:
    """Every seed's evaluation curve in one PNG (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for out in outs:
        csv_path = out / "metrics.csv"
        if not csv_path.exists():
            continue
        with csv_path.open() as f:
            points = [(int(r["env_steps"]), float(r["eval_return"])) for r in csv.DictReader(f)
                      if r.get("eval_return") not in (None, "", "nan")]
        if points:
            ax.plot(*zip(*points), marker=".", label=out.name)
    ax.axhline(target, color="gray", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("env steps")
    ax.set_ylabel("evaluation return")
    ax.set_title(f"{AGENTS[agent][0][:-3]}: evaluation return by seed")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def run_line(agent: str, r: dict) -> str:
    """One run: seed, final and best evaluation, steps to target, wall time, verdict."""
    verdict = "error" if "error" in r else ("pass" if r["passed"] else "FAIL")
    why = []
    if "error" not in r and not r["final_ok"]:
        why.append("final below target")
    if "error" not in r and not r["time_ok"]:
        why.append("over the wall budget")
    return (f"{agent:<5} seed {r['seed']:>4}: final {fmt(r.get('final_eval_return')):>8}  "
            f"best {fmt(r.get('best_eval_return')):>8}  to target "
            f"{fmt(r.get('steps_to_target'), 'd'):>7}"
            f"  process {fmt(r.get('process_s'))} s (run {fmt(r.get('wall_s'))} s, cpu "
            f"{fmt(r.get('cpu_s'))} s, load {fmt(r.get('load_avg_1m_end'))})  {verdict}"
            + (f" ({', '.join(why)})" if why else "")
            + (f" {r['error']}" if "error" in r else ""))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", nargs="+", choices=sorted(AGENTS), default=list(AGENTS))
    parser.add_argument("--seeds", type=int, default=None, help="seeds per agent (default: "
                        "the target's count)")
    parser.add_argument("--first-seed", type=int, default=1, help="the seeds are first-seed, "
                        "first-seed + 1, ... (default 1: not the examples' own seed 0)")
    parser.add_argument("--backend", default=None, help="the examples' --backend (default: "
                        "each example's own default, which the wall budget is judged on)")
    parser.add_argument("--quick", action="store_true", help="5%% of the steps (smoke run)")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "learning"))
    parser.add_argument("--json", default=None, help="where to write the JSON (default: "
                        "benchmarks/results/learning.json, learning_quick.json with --quick)")
    args = parser.parse_args(argv)
    name = "learning_quick.json" if args.quick else "learning.json"
    path = Path(args.json) if args.json else RESULTS / name
    results: list[dict] = []
    for agent in args.agents:
        count = args.seeds or AGENTS[agent][4]
        seeds = list(range(args.first_seed, args.first_seed + count))
        outs = [Path(args.runs_dir) / agent / f"seed{s}" for s in seeds]
        runs = []
        for seed, out in zip(seeds, outs):
            runs.append(train(agent, seed, out, args.quick, args.backend))
            print(run_line(agent, judge_run(agent, runs[-1])), flush=True)
            # the runs so far, so that a stopped benchmark keeps what it measured
            write_json(path, args, [*results, {**judge(agent, runs), "complete": False}])
        results.append(judge(agent, runs))
        if not args.quick:
            plot(agent, outs, AGENTS[agent][1], ROOT / "docs" / f"learning_{agent}.png")
    if args.quick:
        print("\n--quick: smoke runs of 5% of the steps; the targets are not judged")
    print(f"\n{'agent':<6} {'target':>8} {'env steps':>9} {'passed':>7} {'final>=':>8} "
          f"{'final mean':>10} {'final min':>10} {'best min':>9} {'s median':>9} {'s max':>7} "
          f"{'cpu s med':>9}")
    for r in results:
        passed = "-" if args.quick else f"{r['passed']}/{r['seeds']}"
        final_ok = "-" if args.quick else f"{r['final_ok']}/{r['seeds']}"
        print(f"{r['agent']:<6} {r['target']:>8.0f} {r['env_steps']:>9} {passed:>7} "
              f"{final_ok:>8} {fmt(r['final_eval_mean']):>10} {fmt(r['final_eval_min']):>10} "
              f"{fmt(r['best_eval_min']):>9} {fmt(r['process_s_median']):>9} "
              f"{fmt(r['process_s_max']):>7} {fmt(r['cpu_s_median']):>9}")
    print("passed: final evaluation >= target (and process time <= the wall budget); "
          "final>=: the final evaluation alone; best min: the lowest best evaluation; s: the "
          "process's wall time; cpu s: the CPU time of its processes")
    write_json(path, args, results)
    return {"agents": results}


def write_json(path: Path, args: argparse.Namespace, results: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"quick": args.quick, "backend": args.backend,
                                "agents": results}, indent=1))


if __name__ == "__main__":
    main()
