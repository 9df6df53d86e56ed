"""Sharded replay benchmark: throughput with 1, 2 and 4 shards, the sharded client's
overhead against one server, and a Ray deployment against the same topology without Ray.

Run from the repository root::

    python benchmarks/bench_sharded.py [--duration 1.0] [--shards 1,2,4] [--ray [--ray-rounds 5]]

Prints a table and writes JSON to ``benchmarks/results/bench_sharded.json``. Each shard is
a replay server in its own process, the client runs in another; tables hold 2**16 items
of 100 B (as ``bench_net``'s ``100B`` rows) and are full before measuring. Workloads, on
the same tables for every topology:

* ``insert``: ``insert`` of 256 rows a call (one round trip each, returning the keys),
  evicting the oldest.
* ``sample``: batches of 256 from a uniform table through the learner's iterator
  (``sample_iterator(..., in_flight=2)``).
* ``sample+update``: the iterator over a prioritized table (exponent 0.6), each batch's
  new priorities sent with the next request (``it.update_priorities``).

``server`` rows use one :class:`rlreplay.Client` on one server: the sharded client's
overhead is ``sharded x1`` against it at the same load. Each row also reports the CPU the
shard processes used (user + system, from ``/proc``) per 100k items/s, the scaling model
for sizing a cluster. On a machine with few cores, more shards cannot add cores: the
client and the shards share them, and the figures say what each part costs.

``sharded/k`` rows sample the same shards with ``batches_per_request=k`` (``--batches-per-
request``, 4 by default): one request per shard draws ``k`` batches, cut into slices.

With ``--ray`` the 2-shard topology is also started as Ray actors
(:func:`rlreplay.distributed.ray.start_shards` on a local Ray) beside the same 2 shards as
processes; both are measured with the same client in alternating turns for
``--ray-rounds`` rounds, and the median of the per-round ratios is checked against the
target of >= 80 % of the topology without Ray.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from rlreplay.runtime.stop_flag import StopFlag

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.children import reply_from

CTX = mp.get_context("spawn")
DIM = 24  # float32 obs of 96 B + a 4 B reward: 100 B items
SIZE = 1 << 16
BATCH = 256
WORKLOADS = ("insert", "sample", "sample+update")
RAY_TARGET = 0.8  # Ray deployment against the same topology without Ray
TABLE_OF = {"insert": "uni", "sample": "uni", "sample+update": "prio"}


class ShardTables:
    """Picklable builder of one shard's tables (for processes and Ray actors alike)."""

    def __init__(self, seed: int):
        self.seed = seed

    def __call__(self) -> list:
        from rlreplay import Prioritized, Table

        sig = {"obs": ((DIM,), "float32"), "reward": "float32"}
        return [
            Table("uni", signature=sig, max_size=SIZE, seed=self.seed),
            Table("prio", signature=sig, max_size=SIZE, sampler=Prioritized(0.6),
                  seed=self.seed),
        ]


def rows(n: int) -> dict:
    rng = np.random.default_rng(1)
    return {"obs": rng.random((n, DIM), dtype=np.float32), "reward": np.ones(n, "f4")}


def serve(seed: int, out, stop) -> None:
    from rlreplay.net import Server

    server = Server(ShardTables(seed)()).start()
    out.put((server.address, os.getpid()))
    while not stop.is_set():
        time.sleep(0.05)
    server.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prefill(addresses: list[str]) -> None:
    from rlreplay.net import Client

    block = rows(4096)
    for address in addresses:
        client = Client(address)
        for table in ("uni", "prio"):
            for _ in range(SIZE // 4096):
                client.insert(table, block, 1.0)
        client.close()


def work(kind: str, addresses: list[str], plain: bool, duration: float, out,
         per_request: int = 1) -> None:
    """Client process: run ``kind`` for ``duration`` seconds; reports items, wall and CPU."""
    from rlreplay.distributed import ShardedClient
    from rlreplay.net import Client

    client = Client(addresses[0]) if plain else ShardedClient(addresses, seed=0)
    block = rows(BATCH)
    table = TABLE_OF[kind]
    rng = np.random.default_rng(0)
    done = 0
    if kind == "insert":
        client.insert(table, block)  # connect first
        start, cpu = time.perf_counter(), time.process_time()
        while time.perf_counter() - start < duration:
            client.insert(table, block)
            done += BATCH
    else:
        extra = {} if plain else {"batches_per_request": per_request}
        with client.sample_iterator(table, BATCH, in_flight=2, timeout=10.0, **extra) as it:
            next(it)
            start, cpu = time.perf_counter(), time.process_time()
            while time.perf_counter() - start < duration:
                batch = next(it)
                done += len(batch)
                if kind == "sample+update":
                    it.update_priorities(batch.info.keys, rng.random(len(batch)) + 0.1)
    out.put((done, time.perf_counter() - start, time.process_time() - cpu))


def measure(kind: str, addresses: list[str], pids: list[int], plain: bool,
            duration: float, per_request: int = 1) -> dict:
    out = CTX.Queue()
    proc = CTX.Process(target=work, args=(kind, addresses, plain, duration, out, per_request))
    before = [cpu_seconds(p) for p in pids]
    proc.start()
    done, wall, client_cpu = out.get(timeout=duration + 120)
    proc.join(30)
    shard_cpu = sum(cpu_seconds(p) for p in pids) - sum(before)
    rate = done / wall
    return {
        "workload": kind,
        "items_per_s": rate,
        "client_cpu_per_100k": client_cpu / wall / (rate / 1e5),
        # the shards' CPU over the client's run (its start-up included: an upper bound)
        "shard_cpu_per_100k": shard_cpu / wall / (rate / 1e5),
        "shard_cpu_per_100k_per_shard": shard_cpu / wall / (rate / 1e5) / len(pids),
    }


def start_processes(n: int) -> tuple[list[str], list[int], list]:
    started = []
    for seed in range(n):
        out, stop = CTX.Queue(), StopFlag(CTX)
        proc = CTX.Process(target=serve, args=(seed, out, stop), daemon=True)
        proc.start()
        started.append((proc, out, stop))
    addresses, pids = [], []
    for proc, out, _ in started:
        address, pid = reply_from(proc, out, 60)
        addresses.append(address)
        pids.append(pid)
    return addresses, pids, started


def stop_processes(started: list) -> None:
    for _, _, stop in started:
        stop.set()
    for proc, _, _ in started:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def run_topology(name: str, n: int, plain: bool, duration: float, workloads,
                 per_request: int = 1) -> list[dict]:
    addresses, pids, started = start_processes(n)
    try:
        prefill(addresses)
        rows_out = [
            {"topology": name, "shards": n, **measure(k, addresses, pids, plain, duration)}
            for k in workloads
        ]
        if per_request > 1:  # the same shards, each request drawing several batches
            rows_out += [
                {"topology": f"sharded/{per_request}", "shards": n,
                 **measure(k, addresses, pids, plain, duration, per_request)}
                for k in workloads if k != "insert"
            ]
        return rows_out
    finally:
        stop_processes(started)


def compare_ray(n: int, duration: float, workloads, rounds: int) -> tuple[list[dict], dict]:
    """The same ``n`` shards started as processes and as Ray actors, both alive at once and
    measured in alternating turns for ``rounds`` rounds (on a shared machine a load change
    then hits both alike); returns the rows and, per workload, the per-round ratios of Ray
    to processes and their median."""
    import ray

    from rlreplay.distributed.ray import start_shards

    addresses, pids, started = start_processes(n)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        shards = start_shards(lambda i: ShardTables(i), n, num_cpus=0)
        try:
            ray_pids = ray.get([a.pid.remote() for a in shards.actors])
            prefill(addresses)
            prefill(shards.addresses)
            rows_out, ratios = [], {k: [] for k in workloads}
            for _ in range(rounds):
                for k in workloads:
                    plain = measure(k, addresses, pids, False, duration)
                    on_ray = measure(k, shards.addresses, ray_pids, False, duration)
                    rows_out += [{"topology": "processes", "shards": n, **plain},
                                 {"topology": "ray", "shards": n, **on_ray}]
                    ratios[k].append(on_ray["items_per_s"] / plain["items_per_s"])
            summary = {k: {"rounds": v, "median": statistics.median(v)}
                       for k, v in ratios.items()}
            return rows_out, summary
        finally:
            shards.shutdown()
    finally:
        ray.shutdown()
        stop_processes(started)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per measurement")
    parser.add_argument("--shards", default="1,2,4", help="shard counts to measure")
    parser.add_argument("--only", default=None, help="workloads whose name contains this")
    parser.add_argument("--ray", action="store_true", help="also the 2-shard Ray deployment")
    parser.add_argument("--ray-rounds", type=int, default=5,
                        help="alternating rounds of the Ray and processes comparison")
    parser.add_argument("--batches-per-request", type=int, default=4,
                        help="also sample with this many batches per request (1: not)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/)")
    args = parser.parse_args(argv)
    workloads = [w for w in WORKLOADS if args.only is None or args.only in w]
    counts = [int(c) for c in args.shards.split(",")]
    rows_out = run_topology("server", 1, True, args.duration, workloads)
    for n in counts:
        rows_out += run_topology("sharded", n, False, args.duration, workloads,
                                 args.batches_per_request)
    ray_summary = None
    if args.ray:
        ray_rows, ray_summary = compare_ray(2, args.duration, workloads, args.ray_rounds)
        rows_out += ray_rows
    print(f"{'topology':<12}{'shards':>5}  {'workload':<15}{'items/s':>10}"
          f"{'client CPU':>12}{'shard CPU':>11}{'per shard':>11}  (CPU s/s per 100k items/s)")
    for r in rows_out:
        print(f"{r['topology']:<12}{r['shards']:>5}  {r['workload']:<15}"
              f"{r['items_per_s']:>10.0f}{r['client_cpu_per_100k']:>12.2f}"
              f"{r['shard_cpu_per_100k']:>11.2f}{r['shard_cpu_per_100k_per_shard']:>11.2f}")
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "duration_s": args.duration,
        "rows": rows_out,
    }
    base = {r["workload"]: r["items_per_s"] for r in rows_out if r["topology"] == "server"}
    one = {r["workload"]: r["items_per_s"] for r in rows_out
           if r["topology"] == "sharded" and r["shards"] == 1}
    report["sharded_x1_over_server"] = {k: one[k] / base[k] for k in one if k in base}
    if ray_summary is not None:
        report["ray_over_processes_x2"] = {k: v["median"] for k, v in ray_summary.items()}
        report["ray_over_processes_x2_rounds"] = {k: v["rounds"] for k, v in ray_summary.items()}
        print(f"Ray over the same 2 shards as processes, {args.ray_rounds} alternating rounds "
              f"(target >= {RAY_TARGET:.0%}):")
        for k, v in ray_summary.items():
            rounds = " ".join(f"{r:.2f}" for r in v["rounds"])
            verdict = "PASS" if v["median"] >= RAY_TARGET else "FAIL"
            print(f"  {k:<15} median {v['median']:.2f}  rounds {rounds}  {verdict}")
    out = Path(args.out) if args.out else (
        Path(__file__).resolve().parent / "results" / "bench_sharded.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k.endswith(("server", "x2"))},
                     indent=1))
    return report


if __name__ == "__main__":
    main()
