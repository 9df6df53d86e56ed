"""Differential check: the same random operation sequences against real Reverb 0.14 and
``rlreplay.reverb``, compared.

For each configuration (sampler, remover, rate limiter, ``max_times_sampled``; queues and
stacks) a seeded sequence of operations (inserts with priorities, samples, priority
updates, deletes, resets, and checks of ``can_sample`` / ``can_insert`` / size) runs
against a server in each implementation's own interpreter, in process with its tables,
through the client. An operation the rate limiter would block is not issued; that it
blocks is recorded and compared (``blocked``). Items carry their own id as data, so
records compare across implementations whose keys differ.

* Deterministic samplers (Fifo, Lifo, MinHeap, MaxHeap) with deterministic removers: every
  record must be equal (sampled ids in order, ``probability``, ``table_size``,
  ``priority``, ``times_sampled``), and so removal orders and blocking.
* Random samplers (Uniform, Prioritized): after the same inserts and priority updates,
  ``--samples`` samples each; the reported ``probability``, ``priority`` and
  ``table_size`` of each id must be equal, and each implementation's counts must fit the
  expected distribution (chi-square test, p > 0.001), as must the two against each other.

Reverb runs in its own interpreter (Python 3.11 with ``dm-reverb==0.14.0``, TensorFlow 2.15
and ``numpy<2``)::

    python benchmarks/reverb_differential.py --reverb-python /tmp/reverbenv/bin/python

Prints one line per configuration and a summary; exits 1 on any difference. Not part of
CI; its latest result is in docs/coming_from_reverb.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

DETERMINISTIC = ["Fifo", "Lifo", "MinHeap", "MaxHeap"]


# ----------------------------------------------------------------- the worker side
def _selector(reverb, spec):
    name, *args = spec
    return getattr(reverb.selectors, name)(*args)


def _limiter(reverb, spec):
    name, *args = spec
    return getattr(reverb.rate_limiters, name)(*args)


def _table(reverb, config):
    kind = config.get("kind")
    if kind == "queue":
        return reverb.Table.queue("t", config["max_size"])
    if kind == "stack":
        return reverb.Table.stack("t", config["max_size"])
    return reverb.Table(
        "t",
        sampler=_selector(reverb, config["sampler"]),
        remover=_selector(reverb, config["remover"]),
        max_size=config["max_size"],
        rate_limiter=_limiter(reverb, config["limiter"]),
        max_times_sampled=config.get("max_times_sampled", 0),
    )


def run_case(reverb, np, case: dict) -> list:
    """Run ``case["ops"]`` on a fresh server; the records of what happened."""
    table = _table(reverb, case["config"])
    server = reverb.Server(tables=[table])
    client = reverb.Client(f"localhost:{server.port}")
    keys: dict[int, int] = {}  # id -> key, as learned from samples
    out: list = []
    try:
        for op in case["ops"]:
            kind = op["op"]
            if kind == "insert":
                if not table.can_insert(1):
                    out.append(["blocked", "insert"])
                    continue
                client.insert(np.int64(op["id"]), {"t": op["priority"]})
            elif kind == "sample":
                for _ in range(op["n"]):
                    if not table.can_sample(1):
                        out.append(["blocked", "sample"])
                        break
                    [step] = next(client.sample("t", 1))
                    i = int(step.data[0])
                    keys[i] = step.info.key
                    info = step.info
                    out.append(
                        [
                            "sample",
                            i,
                            round(info.probability, 9),
                            int(info.table_size),
                            round(info.priority, 9),
                            int(info.times_sampled),
                        ]
                    )
            elif kind == "count":  # random samplers: many samples, counted by id
                counts: dict[int, int] = {}
                seen: dict[int, list] = {}
                for sample in client.sample("t", op["n"]):
                    info = sample[0].info
                    i = int(sample[0].data[0])
                    keys[i] = info.key
                    counts[i] = counts.get(i, 0) + 1
                    seen[i] = [
                        round(info.probability, 9),
                        round(info.priority, 9),
                        int(info.table_size),
                    ]
                out.append(["count", sorted(counts.items()), sorted(seen.items())])
            elif kind == "mutate":
                updates = {keys[i]: p for i, p in op.get("updates", []) if i in keys}
                deletes = [keys[i] for i in op.get("deletes", []) if i in keys]
                client.mutate_priorities("t", updates=updates, deletes=deletes)
            elif kind == "reset":
                client.reset("t")
                keys.clear()
            elif kind == "check":
                out.append(
                    [
                        "check",
                        bool(table.can_sample(1)),
                        bool(table.can_insert(1)),
                        int(table.info.current_size),
                    ]
                )
    finally:
        server.stop()
    return out


def worker(impl: str) -> None:
    import numpy as np

    if impl == "reverb":
        import reverb
    else:
        import rlreplay.reverb as reverb
    cases = json.load(sys.stdin)
    print(json.dumps([run_case(reverb, np, case) for case in cases]))


# ----------------------------------------------------------------- the sequences
def configs() -> list[dict]:
    out = []
    for sampler in DETERMINISTIC:
        for remover in DETERMINISTIC:
            for mts in (0, 2):
                out.append(
                    {
                        "sampler": [sampler],
                        "remover": [remover],
                        "max_size": 6,
                        "limiter": ["MinSize", 2],
                        "max_times_sampled": mts,
                    }
                )
    out.append({"kind": "queue", "max_size": 4})
    out.append({"kind": "stack", "max_size": 4})
    out.append(
        {
            "sampler": ["Fifo"],
            "remover": ["Fifo"],
            "max_size": 20,
            "limiter": ["SampleToInsertRatio", 2.0, 3, 4.0],
        }
    )
    out.append(
        {
            "sampler": ["Lifo"],
            "remover": ["Fifo"],
            "max_size": 20,
            "limiter": ["SampleToInsertRatio", 0.5, 2, (0.0, 3.0)],
        }
    )
    return out


def exact_ops(rng: random.Random, n: int) -> list[dict]:
    ops, next_id = [], 0
    for _ in range(n):
        r = rng.random()
        if r < 0.45:
            ops.append({"op": "insert", "id": next_id, "priority": float(rng.randint(0, 6))})
            next_id += 1
        elif r < 0.75:
            ops.append({"op": "sample", "n": rng.randint(1, 3)})
        elif r < 0.85 and next_id:
            ids = [rng.randrange(next_id) for _ in range(2)]
            ops.append(
                {
                    "op": "mutate",
                    "updates": [[ids[0], float(rng.randint(0, 6))]],
                    "deletes": [ids[1]] if rng.random() < 0.5 else [],
                }
            )
        elif r < 0.87:
            ops.append({"op": "reset"})
        else:
            ops.append({"op": "check"})
    return ops


def random_cases(rng: random.Random, samples: int) -> list[dict]:
    cases = []
    for sampler in (["Uniform"], ["Prioritized", 1.0], ["Prioritized", 0.6]):
        ops = [{"op": "insert", "id": i, "priority": float(rng.randint(1, 8))} for i in range(8)]
        ops.append({"op": "count", "n": 400})  # learns every key
        ops.append({"op": "mutate", "updates": [[0, 0.0], [1, 20.0], [2, 0.5]], "deletes": [3]})
        ops.append({"op": "count", "n": samples})
        cases.append(
            {
                "config": {
                    "sampler": sampler,
                    "remover": ["Fifo"],
                    "max_size": 100,
                    "limiter": ["MinSize", 1],
                },
                "ops": ops,
                "random": True,
            }
        )
    return cases


def run_impl(impl: str, cases: list[dict], reverb_python: str) -> list:
    here = Path(__file__).resolve()
    if impl == "reverb":
        cmd, env = (
            [reverb_python, str(here), "--worker", "reverb"],
            dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=""),
        )
    else:
        cmd, env = [sys.executable, str(here), "--worker", "rlreplay"], dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(here.parent.parent), *filter(None, [env.get("PYTHONPATH")])]
        )
    done = subprocess.run(
        cmd, input=json.dumps(cases), capture_output=True, text=True, env=env, timeout=1800
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("[")]
    if done.returncode or not lines:
        raise RuntimeError(f"{impl} worker failed:\n{done.stderr[-4000:]}")
    return json.loads(lines[-1])


def _chi2_fit(counts: dict[int, int], expected: dict[int, float]) -> float:
    from scipy.stats import chisquare

    ids = sorted(expected)
    n = sum(counts.values())
    obs = [counts.get(i, 0) for i in ids]
    exp = [expected[i] * n for i in ids]
    return float(chisquare(obs, exp).pvalue)


def compare_random(ours: list, theirs: list) -> list[str]:
    from scipy.stats import chi2_contingency

    problems = []
    (_, c_ours, s_ours), (_, c_theirs, s_theirs) = ours[-1], theirs[-1]
    if dict((i, v) for i, v in s_ours) != dict((i, v) for i, v in s_theirs):
        problems.append(f"probability/priority/table_size differ: {s_ours} vs {s_theirs}")
    expected = {i: v[0] for i, v in s_theirs}
    for name, counts in (("rlreplay", dict(c_ours)), ("reverb", dict(c_theirs))):
        extra = set(counts) - set(expected)
        if extra:
            problems.append(f"{name} sampled ids {sorted(extra)} Reverb never did")
        p = _chi2_fit(counts, expected)
        if p < 1e-3:
            problems.append(f"{name}'s frequencies do not fit the probabilities (p={p:.2g})")
    ids = sorted(expected)
    table = [[dict(c_ours).get(i, 0) for i in ids], [dict(c_theirs).get(i, 0) for i in ids]]
    p = float(chi2_contingency(table).pvalue)
    if p < 1e-3:
        problems.append(f"the two frequency tables differ (chi-square p={p:.2g})")
    return problems


def describe(config: dict) -> str:
    if "kind" in config:
        return f"{config['kind']}({config['max_size']})"
    mts = config.get("max_times_sampled", 0)
    return (
        f"sampler={config['sampler']} remover={config['remover']} "
        f"limiter={config['limiter']}" + (f" max_times_sampled={mts}" if mts else "")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=["reverb", "rlreplay"], help=argparse.SUPPRESS)
    parser.add_argument(
        "--reverb-python",
        default=os.environ.get("RLREPLAY_REVERB_PYTHON", "/tmp/reverbenv/bin/python"),
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", type=int, default=120, help="operations per exact sequence")
    parser.add_argument("--samples", type=int, default=20000, help="samples per random case")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    if not Path(args.reverb_python).exists():
        print(f"no Reverb interpreter at {args.reverb_python}; see --reverb-python")
        return 2
    rng = random.Random(args.seed)
    cases = [{"config": c, "ops": exact_ops(rng, args.ops)} for c in configs()]
    cases += random_cases(rng, args.samples)
    theirs = run_impl("reverb", cases, args.reverb_python)
    ours = run_impl("rlreplay", cases, args.reverb_python)
    failed = unexpected = 0
    for case, a, b in zip(cases, ours, theirs):
        if case.get("random"):
            problems = compare_random(a, b)
        elif a == b:
            problems = []
        else:
            first = next(i for i, (x, y) in enumerate(zip([*a, None], [*b, None])) if x != y)
            problems = [
                f"record {first}: rlreplay {a[first : first + 3]} vs Reverb {b[first : first + 3]}"
            ]
        kinds = {r[0] for r in b}
        known = problems and case["config"].get("remover", ["Fifo"])[0] != "Fifo"
        status = "ok" if not problems else "known" if known else "DIFFERS"
        print(f"{status:7} {describe(case['config'])} ({len(b)} records: {sorted(kinds)})")
        for p in problems:
            print("        ", p)
        failed += bool(problems)
        unexpected += bool(problems) and not known
    print(
        f"{len(cases) - failed}/{len(cases)} configurations agree; {failed - unexpected} "
        f"differ as documented (a full table with a remover other than Fifo: rlreplay "
        f"evicts before it inserts, Reverb after; see docs/coming_from_reverb.md), "
        f"{unexpected} otherwise"
    )
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
