"""Reverb's single remote calls, as the anchor of ``benchmarks/bench_net.py``.

Measures, against a Reverb server in its own process on 127.0.0.1:

* ``client.insert`` of one row at a time (a gymnasium loop's row: numpy scalars);
* ``client.mutate_priorities`` (its priority update) of 256 keys, awaited.

(Reverb's learner loop as its users run it, a streamed ``TrajectoryDataset`` batch then
``mutate_priorities``, is measured by ``benchmarks/bench_reverb_compat.py``.)

Prints one JSON object (rows/s, calls/s, cycles/s). Needs ``dm-reverb`` (with its
TensorFlow), which does not install beside this project's own dependencies; run it with
the interpreter of an environment that has it::

    python -m venv /tmp/reverbenv && /tmp/reverbenv/bin/pip install "dm-reverb[tensorflow]"
    /tmp/reverbenv/bin/python benchmarks/anchors/reverb_calls.py --duration 1.5

Without Reverb it prints ``{"skipped": "..."}`` and exits 0.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

# Run as a script (by another interpreter, too): the repository root for benchmarks.children.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.children import reply_from

PRIO_ITEMS = 1 << 14  # Reverb inserts ~10k items/s: a 2**20 table would take minutes


def serve(out, stop) -> None:
    import reverb

    tables = [
        reverb.Table("rows", sampler=reverb.selectors.Prioritized(0.6),
                     remover=reverb.selectors.Fifo(), max_size=1 << 16,
                     rate_limiter=reverb.rate_limiters.MinSize(1)),
        reverb.Table("prio", sampler=reverb.selectors.Prioritized(0.6),
                     remover=reverb.selectors.Fifo(), max_size=PRIO_ITEMS,
                     rate_limiter=reverb.rate_limiters.MinSize(1)),
    ]  # fmt: skip
    server = reverb.Server(tables=tables)
    out.put(server.port)
    stop.wait(600)
    server.stop()


def measure(port: int, duration: float) -> dict:
    import numpy as np
    import reverb

    client = reverb.Client(f"localhost:{port}")
    obs = np.zeros(4, np.float32)
    result = {}

    # client.insert, one row per call
    end = time.perf_counter() + duration
    start, n = time.perf_counter(), 0
    while time.perf_counter() < end:
        for _ in range(50):
            client.insert([obs, np.int64(1), np.float64(0.5), np.bool_(False)], {"rows": 1.0})
        n += 50
    result["insert_rows_per_s"] = n / (time.perf_counter() - start)

    # fill the prioritized table through a writer (faster than insert)
    rng = np.random.default_rng(0)
    data = rng.random((PRIO_ITEMS, 24), dtype=np.float32)
    with client.writer(max_sequence_length=1) as writer:
        for i in range(PRIO_ITEMS):
            writer.append([data[i], np.float32(1.0)])
            writer.create_item("prio", 1, float(rng.random() + 0.01))
    keys = [s[0].info.key for s in client.sample("prio", num_samples=256)]

    # update_priorities of 256, awaited
    prios = (rng.random(256) + 0.01).tolist()
    updates = dict(zip(map(int, keys), prios))
    end = time.perf_counter() + duration
    start, n = time.perf_counter(), 0
    while time.perf_counter() < end:
        client.mutate_priorities("prio", updates=updates)
        n += 1
    result["update_256_per_s"] = n / (time.perf_counter() - start)
    result["prio_items"] = PRIO_ITEMS
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per measurement")
    args = parser.parse_args()
    try:
        import reverb  # noqa: F401
    except ImportError as exc:
        print(json.dumps({"skipped": f"Reverb is not installed here ({exc})"}))
        return
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=serve, args=(out, stop), daemon=True)
    proc.start()
    try:
        port = reply_from(proc, out, 120)
        result = measure(port, args.duration)
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    result["python"] = sys.version.split()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
