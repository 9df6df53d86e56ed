"""Core replay operations, rlreplay side by side with cpprb in the same run.

Run: python -m benchmarks.bench_core [--quick] [--repeat N] [--only NAMES]

Cases (capacity 1e6, fields obs float32[17], action float32[6], reward, next_obs
float32[17], done; rlreplay uses a rows Table and ``table.insert``, cpprb a ReplayBuffer):

* ``add1``: add one row to a full buffer (the ring overwrites the oldest row);
* ``add256``: add a batch of 256 rows;
* ``sample256``: uniform sample of 256 rows;
* ``per256``: prioritized (alpha 0.6) sample of 256 with importance weights (beta 0.4),
  then 256 priority updates;
* ``per_add1``: add one row to a full prioritized buffer (alpha 0.6, new items at the
  largest priority seen; cpprb's ``PrioritizedReplayBuffer.add``);
* ``add1_gym`` / ``per_add1_gym``: the same one-row adds with the scalars a gymnasium
  loop hands over (``np.float64`` reward, ``np.bool_`` done) instead of Python floats;
* ``img_add256`` / ``img_sample256``: rows with obs and next_obs uint8[84, 84, 4] and scalar
  action/reward/done at capacity 1e5.

Buffers are filled before timing (construction plus the first fill is reported on its
own: first writes to fresh memory are slow). The image store's construction and first
fill is timed in ``--setup-rounds`` rounds per library, alternating which goes first, each
buffer released before the next is made, after one untimed pass that writes as much
memory: so both libraries fill memory the process has used before. (Memory the virtual
machine has never backed costs both alike, about 0.2 to 0.5 GB/s here, whoever meets it;
without the warm-up pass the order of the libraries decides the ratio.) ``--setup-only``
runs these rounds and nothing else.

Each op runs after warm-up calls, in ``--repeat`` rounds of ``number`` calls timed with
``time.perf_counter``; the median round gives microseconds per op (the two libraries'
rounds alternate). ``ratio`` is rlreplay's ops/s over cpprb's (higher is better for
rlreplay). Prints a table and writes ``benchmarks/results/bench_core.json``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script from a checkout: find the package beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rlreplay
from rlreplay import Fifo, Prioritized, Table
from rlreplay.core.keys import make_keys

VEC_CAPACITY = 1_000_000
IMG_CAPACITY = 100_000
BATCH = 256
ALPHA, BETA = 0.6, 0.4
TARGETS = {
    "add1": 5.0,
    "add256": 1.5,
    "sample256": 1.5,
    "per256": 3.0,
    "per_add1": 2.0,
    "add1_gym": 5.0,
    "per_add1_gym": 2.0,
    "img_add256": 1.0,
    "img_sample256": 1.0,
}
INDEX_TARGETS = {"uniform": 24.0, "prioritized": 28.0}  # index bytes per item, at most
SETUP_TARGETS = {"image 1e5": 1.0}  # construct + first fill, cpprb's time / rlreplay's
CASES = tuple(TARGETS)

VEC_SIG = {
    "obs": ((17,), np.float32),
    "action": ((6,), np.float32),
    "reward": ((), np.float32),
    "next_obs": ((17,), np.float32),
    "done": ((), np.float32),
}
IMG_SIG = {
    "obs": ((84, 84, 4), np.uint8),
    "action": ((), np.float32),
    "reward": ((), np.float32),
    "next_obs": ((84, 84, 4), np.uint8),
    "done": ((), np.float32),
}


def cpprb_env(sig: dict) -> dict:
    """cpprb's env_dict for a signature (cpprb stores a scalar as shape 1)."""
    return {k: {"shape": shape or 1, "dtype": dtype} for k, (shape, dtype) in sig.items()}


def random_rows(sig: dict, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for k, (shape, dtype) in sig.items():
        if np.dtype(dtype) == np.uint8:
            out[k] = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
        else:
            out[k] = rng.standard_normal((n, *shape)).astype(dtype)
    return out


def one_rows(sig: dict, count: int, rng: np.random.Generator) -> list[dict]:
    """Single rows as an environment loop gives them: arrays plus Python floats."""
    batch = random_rows(sig, count, rng)
    rows = []
    for i in range(count):
        row = {}
        for k, (shape, _) in sig.items():
            row[k] = batch[k][i] if shape else float(batch[k][i])
        rows.append(row)
    return rows


def gym_rows(rows: list[dict]) -> list[dict]:
    """The same rows with the scalar types gymnasium returns: a ``np.float64`` reward
    and a ``np.bool_`` done flag."""
    return [
        {**r, "reward": np.float64(r["reward"]), "done": np.bool_(r["done"] > 0)} for r in rows
    ]


def time_ops(ops: dict[str, Callable[[], object]], number: int, repeat: int, warmup: int):
    """Median microseconds per call of each op over ``repeat`` rounds of ``number`` calls.

    The ops' rounds alternate, so load from other processes weighs on each alike.
    """
    for op in ops.values():
        for _ in range(warmup):
            op()
    rounds: dict[str, list[float]] = {name: [] for name in ops}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for name, op in ops.items():
                t0 = time.perf_counter()
                for _ in range(number):
                    op()
                rounds[name].append((time.perf_counter() - t0) / number * 1e6)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {
        name: {"us": statistics.median(r), "min_us": min(r), "rounds_us": r}
        for name, r in rounds.items()
    }


class Bench:
    """Holds the options and collects results."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rng = np.random.default_rng(0)
        self.results: dict[str, dict] = {}
        self.setup: list[dict] = []
        self.memory: list[dict] = []

    def record(self, case: str, lib: str, timing: dict) -> None:
        self.results.setdefault(case, {})[lib] = timing
        print(f"  {case:<14} {lib:<8} {timing['us']:10.1f} us", flush=True)

    def run_pair(self, case: str, rl_op: Callable, cp_op: Callable, number: int) -> None:
        a = self.args
        timings = time_ops({"rlreplay": rl_op, "cpprb": cp_op}, number, a.repeat, a.warmup)
        for lib, timing in timings.items():
            self.record(case, lib, timing)

    def fill(
        self,
        lib: str,
        what: str,
        make: Callable,
        add: Callable,
        rows: int,
        chunk: dict,
        record: bool = True,
    ):
        """Construct a buffer and add ``rows`` rows in chunks; returns the buffer (the
        times go to the setup rows when ``record``)."""
        n_chunk = len(next(iter(chunk.values())))
        t0 = time.perf_counter()
        buf = make()
        t1 = time.perf_counter()
        for _ in range(rows // n_chunk):
            add(buf, chunk)
        t2 = time.perf_counter()
        if not record:
            return buf
        self.setup.append(
            {
                "buffer": what,
                "lib": lib,
                "rows": rows,
                "construct_s": t1 - t0,
                "fill_s": t2 - t1,
                "total_s": t2 - t0,
            }
        )
        print(f"  setup {what:<18} {lib:<8} construct {t1 - t0:6.3f}s fill {t2 - t1:6.2f}s")
        return buf

    # ------------------------------------------------------------------ vectors
    def vector_cases(self) -> None:
        a = self.args
        wanted = [c for c in ("add1", "add1_gym", "add256", "sample256") if c in a.only]
        per_wanted = [c for c in ("per256", "per_add1", "per_add1_gym") if c in a.only]
        if not wanted and not per_wanted:
            return
        import cpprb

        fill_rows = a.fill
        chunk = random_rows(VEC_SIG, 10_000, self.rng)
        batch = random_rows(VEC_SIG, BATCH, self.rng)
        singles = one_rows(VEC_SIG, 1024, self.rng)
        gym_singles = gym_rows(singles)
        new_prios = [self.rng.uniform(0.01, 2.0, BATCH) for _ in range(64)]

        def rl_insert(t, rows):
            t.insert(rows)

        def cp_add(b, rows):
            b.add(**rows)

        if wanted:
            table = self.fill(
                "rlreplay",
                "uniform 1e6",
                lambda: Table("uniform", signature=VEC_SIG, max_size=VEC_CAPACITY),
                rl_insert,
                fill_rows,
                chunk,
            )
            self.memory.append(self.index_memory("uniform", table))
            rb = self.fill(
                "cpprb",
                "uniform 1e6",
                lambda: cpprb.ReplayBuffer(VEC_CAPACITY, cpprb_env(VEC_SIG)),
                cp_add,
                fill_rows,
                chunk,
            )
            self.vector_ops(wanted, table, rb, batch, singles, gym_singles)
            del table, rb
            gc.collect()
        if per_wanted:
            table = self.fill(
                "rlreplay",
                "prioritized 1e6",
                lambda: Table(
                    "per",
                    signature=VEC_SIG,
                    max_size=VEC_CAPACITY,
                    sampler=Prioritized(ALPHA),
                    remover=Fifo(),
                ),
                rl_insert,
                fill_rows,
                chunk,
            )
            # Spread the priorities so the tree is not flat.
            size = len(table)
            slots = np.arange(size, dtype=np.int64)
            keys = make_keys(slots, table.index.generation[:size], table.index.origin)
            table.update_priorities(keys, self.rng.uniform(0.01, 2.0, size))
            self.memory.append(self.index_memory("prioritized", table))
            rb = self.fill(
                "cpprb",
                "prioritized 1e6",
                lambda: cpprb.PrioritizedReplayBuffer(
                    VEC_CAPACITY, cpprb_env(VEC_SIG), alpha=ALPHA
                ),
                cp_add,
                fill_rows,
                chunk,
            )
            rb.update_priorities(np.arange(size), self.rng.uniform(0.01, 2.0, size))
            cycle = iter(range(1 << 62))

            def rl_per():
                s = table.sample(BATCH)
                s.importance_weights(BETA)
                table.update_priorities(s.info.keys, new_prios[next(cycle) & 63])

            def cp_per():
                s = rb.sample(BATCH, beta=BETA)
                rb.update_priorities(s["indexes"], new_prios[next(cycle) & 63])

            if "per256" in per_wanted:
                self.run_pair("per256", rl_per, cp_per, a.number_sample)
            for name, rows in (("per_add1", singles), ("per_add1_gym", gym_singles)):
                if name in per_wanted:
                    self.one_row_adds(name, table, rb, rows)
            del table, rb
            gc.collect()

    def one_row_adds(self, name: str, table, rb, rows: list[dict]) -> None:
        """Time adding one row at a time (the rows cycle) to both libraries."""
        it = iter(range(1 << 62))
        self.run_pair(
            name,
            lambda: table.insert(rows[next(it) & 1023]),
            lambda: rb.add(**rows[next(it) & 1023]),
            self.args.number_add1,
        )

    def vector_ops(self, wanted, table, rb, batch, singles, gym_singles) -> None:
        a = self.args
        for name, rows in (("add1", singles), ("add1_gym", gym_singles)):
            if name in wanted:
                self.one_row_adds(name, table, rb, rows)
        if "add256" in wanted:
            self.run_pair(
                "add256", lambda: table.insert(batch), lambda: rb.add(**batch), a.number_batch
            )
        if "sample256" in wanted:
            self.run_pair(
                "sample256", lambda: table.sample(BATCH), lambda: rb.sample(BATCH), a.number_sample
            )

    # ------------------------------------------------------------------- images
    def image_cases(self) -> None:
        a = self.args
        wanted = [c for c in ("img_add256", "img_sample256") if c in a.only]
        if not wanted and not a.setup_only:
            return
        import cpprb

        chunk = random_rows(IMG_SIG, BATCH, self.rng)
        makers = {
            "rlreplay": (
                lambda: Table("images", signature=IMG_SIG, max_size=IMG_CAPACITY),
                lambda t, rows: t.insert(rows),
            ),
            "cpprb": (
                lambda: cpprb.ReplayBuffer(IMG_CAPACITY, cpprb_env(IMG_SIG)),
                lambda b, rows: b.add(**rows),
            ),
        }
        self.setup_rounds("image 1e5", makers, a.img_fill, chunk, a.setup_rounds)
        if a.setup_only:
            return
        # Both buffers (about 5.6 GB each at capacity 1e5) are held at once, so the two
        # libraries' timed rounds alternate as in the vector cases: a copy of 14 MB moves
        # with whatever else the machine does, and alternating spreads that over both.
        table, rb = (
            self.fill(lib, "image 1e5", *makers[lib], a.img_fill, chunk, record=False)
            for lib in ("rlreplay", "cpprb")
        )
        self.image_ops(wanted, table, rb, chunk)
        del table, rb
        gc.collect()

    def setup_rounds(self, what: str, makers: dict, rows: int, chunk: dict, rounds: int) -> None:
        """Time construction plus first fill of each library's buffer, ``rounds`` times,
        alternating the order, each buffer released before the next is made, after one
        untimed pass that writes as much memory (see the module's docstring)."""
        nbytes = rows * sum(
            int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
            for shape, dt in IMG_SIG.values()
        )
        warm = np.ones(nbytes, dtype=np.uint8)
        del warm
        libs = list(makers)
        for r in range(rounds):
            for lib in libs if r % 2 == 0 else libs[::-1]:
                buf = self.fill(lib, what, *makers[lib], rows, chunk)
                del buf
                gc.collect()

    def image_ops(self, wanted, table, rb, chunk: dict) -> None:
        number = self.args.number_img
        if "img_add256" in wanted:
            self.run_pair(
                "img_add256", lambda: table.insert(chunk), lambda: rb.add(**chunk), number
            )
        if "img_sample256" in wanted:
            self.run_pair(
                "img_sample256", lambda: table.sample(BATCH), lambda: rb.sample(BATCH), number
            )

    # ------------------------------------------------------------------- memory
    @staticmethod
    def index_memory(kind: str, table: Table) -> dict:
        per_item = table.index_nbytes() / table.max_size
        row = {
            "table": kind,
            "index_bytes": table.index_nbytes(),
            "max_size": table.max_size,
            "index_bytes_per_item": per_item,
            "stored_bytes_per_step": table.store.signature.step_nbytes,
            "target_bytes_per_item": INDEX_TARGETS[kind],
            "pass": per_item <= INDEX_TARGETS[kind],
        }
        print(f"  index memory {kind:<12} {per_item:6.1f} bytes/item")
        return row

    # ------------------------------------------------------------------- report
    def report(self) -> dict:
        rows = []
        for case in CASES:
            res = self.results.get(case)
            if not res or "rlreplay" not in res or "cpprb" not in res:
                continue
            rl, cp = res["rlreplay"]["us"], res["cpprb"]["us"]
            ratio = cp / rl
            rows.append(
                {
                    "case": case,
                    "rlreplay_us": rl,
                    "cpprb_us": cp,
                    "rlreplay_ops_s": 1e6 / rl,
                    "cpprb_ops_s": 1e6 / cp,
                    "ratio": ratio,
                    "target": TARGETS[case],
                    "pass": ratio >= TARGETS[case],
                }
            )
        print()
        head = (
            f"{'case':<14} {'rlreplay us':>12} {'cpprb us':>10} {'rlreplay ops/s':>15} "
            f"{'cpprb ops/s':>12} {'ratio':>7} {'target':>7}  result"
        )
        print(head)
        print("-" * len(head))
        for r in rows:
            print(
                f"{r['case']:<14} {r['rlreplay_us']:12.1f} {r['cpprb_us']:10.1f} "
                f"{r['rlreplay_ops_s']:15,.0f} {r['cpprb_ops_s']:12,.0f} {r['ratio']:6.2f}x "
                f"{r['target']:6.1f}x  {'PASS' if r['pass'] else 'FAIL'}"
            )
        print("(ratio = rlreplay ops/s / cpprb ops/s, same run)")
        for m in self.memory:
            print(
                f"index memory {m['table']:<12} {m['index_bytes_per_item']:5.1f} bytes/item "
                f"(target <= {m['target_bytes_per_item']:g}; stored fields "
                f"{m['stored_bytes_per_step']} "
                f"bytes/step)  {'PASS' if m['pass'] else 'FAIL'}"
            )
        for s in self.setup:
            print(
                f"setup {s['buffer']:<16} {s['lib']:<8} rows {s['rows']:>9,} construct "
                f"{s['construct_s']:6.3f}s first fill {s['fill_s']:6.2f}s"
            )
        setup_rows = self.setup_summary()
        for r in setup_rows:
            verdict = "" if r["target"] is None else ("  PASS" if r["pass"] else "  FAIL")
            target = "" if r["target"] is None else f" (target >= {r['target']:g}x)"
            print(
                f"construct + first fill {r['buffer']:<16} rlreplay {r['rlreplay_s']:6.2f}s "
                f"cpprb {r['cpprb_s']:6.2f}s (medians) ratio {r['ratio']:5.2f}x{target}{verdict}"
            )
        return {
            "machine": {
                "python": platform.python_version(),
                "numpy": np.__version__,
                "rlreplay": rlreplay.__version__,
                "cpprb": importlib.metadata.version("cpprb"),
                "platform": platform.platform(),
                "processor": platform.processor(),
                "cpus": os.cpu_count(),
            },
            "options": vars(self.args) | {"only": sorted(self.args.only)},
            "rows": rows,
            "index_memory": self.memory,
            "setup": self.setup,
            "setup_ratios": setup_rows,
            "raw": self.results,
            "all_pass": all(r["pass"] for r in rows)
            and all(m["pass"] for m in self.memory)
            and all(r["pass"] is not False for r in setup_rows),
        }

    def setup_summary(self) -> list[dict]:
        """Per buffer measured by both libraries: the median construct + first fill time
        of each and their ratio (cpprb's time over rlreplay's: higher is better)."""
        out = []
        for what in dict.fromkeys(s["buffer"] for s in self.setup):
            totals = {
                lib: [s["total_s"] for s in self.setup if s["buffer"] == what and s["lib"] == lib]
                for lib in ("rlreplay", "cpprb")
            }
            if not totals["rlreplay"] or not totals["cpprb"]:
                continue
            rl, cp = (statistics.median(totals[lib]) for lib in ("rlreplay", "cpprb"))
            target = SETUP_TARGETS.get(what)
            ratio = cp / rl
            out.append(
                {
                    "buffer": what,
                    "rlreplay_s": rl,
                    "cpprb_s": cp,
                    "ratio": ratio,
                    "target": target,
                    "pass": None if target is None else ratio >= target,
                }
            )
        return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer timed calls and rounds")
    p.add_argument("--repeat", type=int, default=None, help="timed rounds (default 7, quick 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls before timing")
    p.add_argument("--only", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    p.add_argument("--fill", type=int, default=None, help="rows before timing (default 1e6)")
    p.add_argument("--img-fill", type=int, default=None, help="image rows (default 1e5)")
    p.add_argument(
        "--setup-rounds", type=int, default=2, help="image construct + fill rounds per library"
    )
    p.add_argument(
        "--setup-only",
        action="store_true",
        help="only the image construct + first fill rounds",
    )
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_core.json"))
    args = p.parse_args(argv)
    quick = args.quick
    args.repeat = args.repeat or (3 if quick else 7)
    args.warmup = args.warmup if args.warmup is not None else (20 if quick else 100)
    # Fill completely even when quick: adds into never-touched memory pay page faults.
    args.fill = args.fill or VEC_CAPACITY
    args.img_fill = args.img_fill or IMG_CAPACITY
    args.number_add1 = 2000 if quick else 10_000
    args.number_batch = 200 if quick else 1000
    args.number_sample = 100 if quick else 500
    args.number_img = 10 if quick else 40
    args.only = set(args.only.split(","))
    unknown = args.only - set(CASES)
    if unknown:
        p.error(f"unknown cases {sorted(unknown)}; choose from {CASES}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    bench = Bench(args)
    if not args.setup_only:
        bench.vector_cases()
    bench.image_cases()
    result = bench.report()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
