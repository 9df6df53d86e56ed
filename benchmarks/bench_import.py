"""Time `import rlreplay` in fresh interpreters (target: well under 0.3 s).

Run: python benchmarks/bench_import.py [--repeat N]
Prints a table and writes benchmarks/results/bench_import.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CODE = "import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"


def time_import(module: str, repeat: int) -> list[float]:
    return [
        float(
            subprocess.run(
                [sys.executable, "-c", CODE.format(module=module)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for _ in range(repeat)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for module in ("numpy", "rlreplay"):
        times = time_import(module, args.repeat)
        rows.append({"module": module, "median_s": statistics.median(times), "min_s": min(times)})
    print(f"{'module':<10} {'median':>9} {'min':>9}")
    for r in rows:
        print(f"{r['module']:<10} {r['median_s'] * 1e3:7.1f}ms {r['min_s'] * 1e3:7.1f}ms")
    target = rows[-1]["median_s"] < 0.3
    print(f"import rlreplay < 300 ms: {'PASS' if target else 'FAIL'}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_import.json").write_text(json.dumps({"rows": rows, "pass": target}, indent=2))


if __name__ == "__main__":
    main()
