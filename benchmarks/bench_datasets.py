"""Datasets out of and into replay: throughput of the .npz and Minari paths.

A prioritized table of step rows (``obs``/``next_obs`` float32[64], action, reward,
terminated, truncated; episodes of 200 steps) is exported and imported:

* ``.npz``: :func:`export_npz` / :func:`import_npz` against the floor of writing and
  reading the same step columns with ``np.savez`` / ``np.load`` alone;
* Minari (when installed): :func:`export_minari`, :func:`import_minari` into a table of
  rows, and through an ``NStepTransitionAdder`` (one ``add`` per step, on a tenth of the
  episodes).

Files go to a temporary directory (page cache: these are not disk figures). Run:
``python benchmarks/bench_datasets.py`` (``--steps`` to change the size, default 200k).
Prints a table and writes JSON to benchmarks/results/bench_datasets.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlreplay import NStepTransitionAdder, Prioritized, Table
from rlreplay.datasets import export_minari, export_npz, import_minari, import_npz

OBS = 64
EPISODE = 200
SIG = {
    "obs": ((OBS,), "float32"),
    "action": "int64",
    "reward": "float32",
    "terminated": "bool",
    "truncated": "bool",
    "next_obs": ((OBS,), "float32"),
}


def filled(steps: int) -> Table:
    table = Table("replay", signature=SIG, max_size=steps, sampler=Prioritized(0.6), seed=0)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(steps + 1, OBS)).astype(np.float32)
    ends = (np.arange(steps) % EPISODE) == EPISODE - 1
    chunk = min(50_000, steps)
    for i in range(0, steps, chunk):
        s = slice(i, i + chunk)
        n = len(ends[s])
        table.insert(
            {
                "obs": obs[s],
                "action": rng.integers(0, 4, n),
                "reward": rng.normal(size=n),
                "terminated": ends[s],
                "truncated": np.zeros(n, bool),
                "next_obs": obs[i + 1 : i + 1 + n],
            },
            rng.random(n) + 0.1,
        )
    return table


def longest_insert_wait(table: Table, during) -> tuple[float, int]:
    """Run ``during()`` while another thread inserts one row at a time into ``table``;
    returns the longest single insert (seconds) and how many inserts ran."""
    row = {k: np.zeros(table.store.signature[k].shape, table.store.signature[k].dtype)
           for k in SIG}  # fmt: skip
    longest, count, stop = [0.0], [0], threading.Event()

    def insert() -> None:
        while not stop.is_set() and count[0] < 1_000_000:
            start = time.perf_counter()
            table.insert(row)
            longest[0] = max(longest[0], time.perf_counter() - start)
            count[0] += 1

    thread = threading.Thread(target=insert)
    thread.start()
    try:
        during()
    finally:
        stop.set()
        thread.join()
    return longest[0], count[0]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    args = parser.parse_args()
    steps = args.steps - args.steps % EPISODE
    table = filled(steps)
    mb = table.store.nbytes / 1e6
    folder = Path(tempfile.mkdtemp())
    rows: list[tuple[str, float, str]] = []
    try:
        columns = table.store.read(np.arange(steps))
        _, t = timed(lambda: np.savez(folder / "floor.npz", **columns))
        rows.append(("np.savez of the step columns (floor)", t, f"{mb / t:.0f} MB/s"))
        _, t = timed(lambda: {k: v for k, v in np.load(folder / "floor.npz").items()})
        rows.append(("np.load of the step columns (floor)", t, f"{mb / t:.0f} MB/s"))
        path, t = timed(lambda: export_npz(table, folder / "replay.npz"))
        rows.append(("export_npz (steps, items, priorities)", t, f"{mb / t:.0f} MB/s"))
        wait, count = longest_insert_wait(table, lambda: export_npz(table, folder / "w.npz"))
        rows.append(
            (f"longest insert during export_npz ({count} inserts)", wait, "one chunk's copy")
        )
        copy = Table("replay", signature=SIG, max_size=steps, sampler=Prioritized(0.6))
        _, t = timed(lambda: import_npz(path, copy))
        rows.append(("import_npz (validated, items re-created)", t, f"{mb / t:.0f} MB/s"))
        try:
            import minari
        except ImportError:
            minari = None
        if minari is not None:
            meta = dict.fromkeys(
                ("author", "author_email", "code_permalink", "algorithm_name", "description"), "-"
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dataset, t = timed(
                    lambda: export_minari(table, "bench-v0", root=folder / "m", **meta)
                )
            rows.append(("export_minari", t, f"{steps / t:,.0f} steps/s"))
            rows_table = Table("replay", signature=SIG, max_size=steps)
            _, t = timed(lambda: import_minari(dataset, rows_table))
            rows.append(("import_minari into a table of rows", t, f"{steps / t:,.0f} steps/s"))
            tenth = minari.MinariDataset(
                folder / "m" / "bench-v0" / "data",
                episode_indices=np.arange(max(1, steps // EPISODE // 10)),
            )
            sig = NStepTransitionAdder.signature(obs=((OBS,), "float32"), action="int64")
            nstep = Table("n", signature=sig, max_size=steps,
                          layout=NStepTransitionAdder.layout(sig, n=3))  # fmt: skip
            adder = NStepTransitionAdder(nstep, n=3, discount=0.99)
            result, t = timed(lambda: import_minari(tenth, adder))
            rows.append(
                (
                    "import_minari through NStepTransitionAdder",
                    t,
                    f"{result.steps / t:,.0f} steps/s",
                )
            )
    finally:
        shutil.rmtree(folder)
    print(f"{steps:,} steps, {mb:.0f} MB of step columns")
    for label, seconds, rate in rows:
        print(f"{label:<46} {seconds:8.3f} s  {rate:>16}")
    out = Path(__file__).resolve().parent / "results" / "bench_datasets.json"
    out.write_text(
        json.dumps(
            {
                "steps": steps,
                "megabytes": round(mb, 1),
                "python": platform.python_version(),
                "numpy": np.__version__,
                "rows": [{"what": w, "seconds": round(s, 4), "rate": r} for w, s, r in rows],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
