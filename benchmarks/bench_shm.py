"""Same-host paths for image batches: in process, through shared memory, through the socket.

Run from the repository root (about 40 s)::

    python benchmarks/bench_shm.py [--duration 1.5] [--rounds 3] [--transport ipc|tcp]

A server process serves two tables of ``u8[84,84,4]`` frames (plus a ``float32`` reward):
``sample`` (4096 items, full) and ``write`` (2048 items, evicting). The benchmark process
measures, in alternating rounds so that a busy machine slows every path alike:

* ``sample 256``: ``Table.sample(256)`` on an identical table in this process; one
  ``client.sample("sample", 256)`` at a time through shared memory
  (``Client(shared_memory=True)``) and through the socket (``shared_memory=False``); and
  the learner's loop ``client.sample_iterator(..., in_flight=2)`` on both paths.
* ``insert 32``: ``Table.insert`` of 32 frames at a time in process, and pipelined
  ``client.insert`` of 32 frames (then ``flush``) through the socket.

Every batch is dropped before the next (a learner holding batches would need more reply
slots, see ``docs/shared_memory.md``). The median of the rounds is printed for each path
with its ratio to in process, and written to ``benchmarks/results/bench_shm.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

CTX = mp.get_context("spawn")
FRAME = (84, 84, 4)
SAMPLE_ITEMS, WRITE_ITEMS, BATCH, INSERT_ROWS = 4096, 2048, 256, 32


def make_tables():
    from rlreplay import Table

    sig = {"obs": (FRAME, "uint8"), "reward": "float32"}
    return [
        Table("sample", signature=sig, capacity=SAMPLE_ITEMS, seed=1),
        Table("write", signature=sig, capacity=WRITE_ITEMS, seed=2),
    ]


def frames(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 255, (n, *FRAME), dtype=np.uint8)
    return {"obs": obs, "reward": rng.random(n, dtype=np.float32)}


def fill(tables) -> None:
    block = frames(512)
    for t in tables:
        for _ in range(t.max_size // 512):
            t.insert(block)


def serve(address: str, out, stop) -> None:
    from rlreplay.net import Server

    tables = make_tables()
    fill(tables)
    if address.startswith("ipc://"):
        server = Server(tables, bind=address).start()
    else:
        server = Server(tables).start()
    out.put(server.address)
    stop.wait(600.0)
    server.stop()


def rate(step, duration: float) -> float:
    """Calls of ``step`` per second over ``duration`` seconds (after one warm-up call)."""
    step()
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < duration:
        step()
        n += 1
    return n / elapsed


def iterator_step(client, table: str):
    it = client.sample_iterator(table, BATCH, in_flight=2)

    def step() -> None:
        next(it)

    step.close = it.close  # type: ignore[attr-defined]
    return step


def insert_remote(client, rows, duration: float) -> float:
    """Rows per second of pipelined inserts, the final flush inside the timing."""
    client.insert("write", rows)
    client.flush(timeout=60.0)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        client.insert("write", rows)
        n += len(rows["obs"])
    client.flush(timeout=60.0)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transport", choices=("ipc", "tcp"), default="ipc")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_shm.json"))
    args = parser.parse_args()

    from rlreplay.net import Client
    from rlreplay.net.shm import is_shared
    from rlreplay.runtime.stop_flag import StopFlag

    local = {t.name: t for t in make_tables()}
    fill(local.values())
    tmp = tempfile.mkdtemp(prefix="rlreplay-bench-")
    address = f"ipc://{tmp}/server" if args.transport == "ipc" else "tcp"
    out, stop = CTX.Queue(), StopFlag(CTX)
    proc = CTX.Process(target=serve, args=(address, out, stop), daemon=True)
    proc.start()
    try:
        address = out.get(timeout=120)
        shm = Client(address, shared_memory=True)
        sock = Client(address, shared_memory=False)
        shm.sample("sample", BATCH)  # the first reply says how large a slot must be
        if not is_shared(shm.sample("sample", BATCH).data["obs"]):
            raise RuntimeError("batches do not come through shared memory")
        rows = frames(INSERT_ROWS, seed=3)
        paths = {
            "sample 256 | in process": lambda: rate(lambda: local["sample"].sample(BATCH), d),
            "sample 256 | shared memory": lambda: rate(lambda: shm.sample("sample", BATCH), d),
            "sample 256 | socket": lambda: rate(lambda: sock.sample("sample", BATCH), d),
            "sample 256 iterator | shared memory": lambda: iterated(shm),
            "sample 256 iterator | socket": lambda: iterated(sock),
            "insert 32 | in process": lambda: INSERT_ROWS
            * rate(lambda: local["write"].insert(rows), d),
            "insert 32 | socket": lambda: insert_remote(sock, rows, d),
        }

        def iterated(client) -> float:
            step = iterator_step(client, "sample")
            try:
                return rate(step, d)
            finally:
                step.close()

        d = args.duration
        runs: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(args.rounds):
            for name, measure in paths.items():
                runs[name].append(measure())
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    med = {k: statistics.median(v) for k, v in runs.items()}
    base = {"sample": med["sample 256 | in process"], "insert": med["insert 32 | in process"]}
    rows_out = []
    print(f"{'path':40} {'median':>12} {'vs in process':>14}  rounds")
    for name, value in med.items():
        kind = "sample" if name.startswith("sample") else "insert"
        unit = "batches/s" if kind == "sample" else "rows/s"
        ratio = value / base[kind]
        rows_out.append({"path": name, "median": value, "unit": unit, "ratio": ratio,
                         "rounds": runs[name]})
        rounds = " ".join(f"{v:.0f}" for v in runs[name])
        print(f"{name:40} {value:9.0f} {unit[:4]:>4} {ratio:13.2f}x  {rounds}")
    gbps = med["sample 256 | shared memory"] * BATCH * np.prod(FRAME) / 1e9
    print(f"shared memory single calls move {gbps:.2f} GB/s of frames")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"transport": args.transport, "duration": args.duration,
                   "rounds": args.rounds, "cpus": os.cpu_count(),
                   "machine": platform.machine(), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
