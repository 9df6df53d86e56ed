"""Same-host paths for image batches: in process, through shared memory, through the socket.

Run from the repository root (about 60 s)::

    python benchmarks/bench_shm.py [--duration 0.6] [--rounds 5] [--transport ipc|tcp]

A server process serves two tables of ``u8[84,84,4]`` frames (plus a ``float32`` reward):
``sample`` (4096 items, full) and ``write`` (2048 items, evicting). The benchmark process
measures, in alternating rounds so that a busy machine slows every path alike:

* ``sample 256``: ``Table.sample(256)`` on an identical table in this process; one
  ``client.sample("sample", 256)`` at a time through shared memory
  (``Client(shared_memory=True)``) and through the socket (``shared_memory=False``); and
  the learner's loop ``client.sample_iterator(...)`` (4 requests in flight) on both paths.
* ``insert 32``, ``insert 256``: ``Table.insert`` of 32 (256) frames at a time in
  process, and ``client.insert`` of as many (one round trip each) through shared memory
  and through the socket.
* ``write 1 step``: an actor's loop, ``writer.append(step)`` then
  ``writer.create_item("write")`` for every step: a ``TrajectoryWriter`` in process, and
  ``client.trajectory_writer("write", chunk_steps=256, max_in_flight=4)`` (chunks of 7 MB)
  through shared memory and through the socket.

Every batch is dropped before the next (a learner holding batches would need more reply
slots, see ``docs/shared_memory.md``). Printed for each path: the median of the rounds,
the median of its per-round ratios to in process, and the CPU time this process and the
server process spent together per batch or row (what the path costs where cores are free:
on a loaded machine a path that needs two processes waits for the other more often).
Results go to ``benchmarks/results/bench_shm.json``.
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


TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rate(step, duration: float) -> float:
    """Calls of ``step`` per second over ``duration`` seconds (after one warm-up call)."""
    step()
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < duration:
        step()
        n += 1
    return n / elapsed


def measured(measure, server_pid: int) -> tuple[float, float]:
    """``measure()`` (a rate) and the CPU seconds this process and the server spent,
    together, per unit of that rate (what the path costs on free cores)."""
    cpu = time.process_time() + process_cpu_s(server_pid)
    start = time.perf_counter()
    value = measure()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() + process_cpu_s(server_pid) - cpu
    return value, cpu / (value * elapsed)


def iterator_step(client, table: str):
    it = client.sample_iterator(table, BATCH)  # in_flight=4, its default

    def step() -> None:
        next(it)

    step.close = it.close  # type: ignore[attr-defined]
    return step


def insert_local(table, rows, duration: float) -> float:
    """Rows per second of ``Table.insert(rows)``."""
    return len(rows["obs"]) * rate(lambda: table.insert(rows), duration)


def insert_remote(client, rows, duration: float) -> float:
    """Rows per second of ``client.insert(rows)``, each call answered."""
    client.insert("write", rows)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        client.insert("write", rows)
        n += len(rows["obs"])
    return n / (time.perf_counter() - start)


WRITE_STEPS = 256  # steps appended per timed block (one item each)


def write_steps(writer, steps: list, duration: float) -> float:
    """Steps per second an actor's loop appends (one item per step), the final flush
    inside the timing."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        for step in steps:
            writer.append(step)
            writer.create_item("write")
        n += len(steps)
    writer.flush()
    return n / (time.perf_counter() - start)


def write_remote(client, steps: list, duration: float) -> float:
    with client.trajectory_writer("write", chunk_steps=WRITE_STEPS, max_in_flight=4) as w:
        return write_steps(w, steps, duration)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=0.6, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--transport", choices=("ipc", "tcp"), default="ipc")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_shm.json"))
    args = parser.parse_args()

    from rlreplay import TrajectoryWriter
    from rlreplay.net import Client
    from rlreplay.net.client.shm import is_shared
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
        big = frames(256, seed=5)
        block = frames(WRITE_STEPS, seed=4)
        steps = [{k: v[i] for k, v in block.items()} for i in range(WRITE_STEPS)]
        paths = {
            "sample 256 | in process": lambda: rate(lambda: local["sample"].sample(BATCH), d),
            "sample 256 | shared memory": lambda: rate(lambda: shm.sample("sample", BATCH), d),
            "sample 256 | socket": lambda: rate(lambda: sock.sample("sample", BATCH), d),
            "sample 256 iterator | shared memory": lambda: iterated(shm),
            "sample 256 iterator | socket": lambda: iterated(sock),
            "insert 32 | in process": lambda: insert_local(local["write"], rows, d),
            "insert 32 | shared memory": lambda: insert_remote(shm, rows, d),
            "insert 32 | socket": lambda: insert_remote(sock, rows, d),
            "insert 256 | in process": lambda: insert_local(local["write"], big, d),
            "insert 256 | shared memory": lambda: insert_remote(shm, big, d),
            "insert 256 | socket": lambda: insert_remote(sock, big, d),
            "write 1 step | in process": lambda: write_steps(
                TrajectoryWriter(local["write"]), steps, d
            ),
            "write 1 step | shared memory": lambda: write_remote(shm, steps, d),
            "write 1 step | socket": lambda: write_remote(sock, steps, d),
        }

        def iterated(client) -> float:
            step = iterator_step(client, "sample")
            try:
                return rate(step, d)
            finally:
                step.close()

        d = args.duration
        runs: dict[str, list[float]] = {k: [] for k in paths}
        cpus: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(args.rounds):
            for name, measure in paths.items():
                value, cpu = measured(measure, proc.pid)
                runs[name].append(value)
                cpus[name].append(cpu)
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    med = {k: statistics.median(v) for k, v in runs.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpus.items()}
    rows_out = []
    print(f"{'path':37} {'median':>16} {'vs in process':>14} {'CPU us/op':>10}  rounds")
    for name, value in med.items():
        unit = "batches/s" if name.startswith("sample") else "rows/s"
        base = runs[name.split(" | ")[0].replace(" iterator", "") + " | in process"]
        # the median of each round's ratio: the load of a busy machine drifts between rounds
        ratio = statistics.median(v / b for v, b in zip(runs[name], base))
        cpu_us = cpu_med[name] * 1e6
        rows_out.append({"path": name, "median": value, "unit": unit, "ratio": ratio,
                         "rounds": runs[name], "cpu_us_per_op": cpu_us})
        rounds = " ".join(f"{v:.0f}" for v in runs[name])
        print(f"{name:37} {value:8.0f} {unit:>9} {ratio:13.2f}x {cpu_us:10.1f}  {rounds}")
    gbps = med["sample 256 | shared memory"] * BATCH * np.prod(FRAME) / 1e9
    print(f"shared memory single calls move {gbps:.2f} GB/s of frames")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"transport": args.transport, "duration": args.duration,
                   "rounds": args.rounds, "cpus": os.cpu_count(),
                   "machine": platform.machine(), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
