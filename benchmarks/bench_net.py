"""Replay server benchmark: throughput through the network against the in-process table.

Run from the repository root::

    python benchmarks/bench_net.py [--duration 1.5] [--quick] [--ipc] [--repeat 3]

Prints a table and writes JSON to ``benchmarks/results/bench_net_{tcp,ipc}.json``. The
server runs in its own process; each client count uses that many client processes. Tables
are full before measuring (writers evict the oldest items). Workloads:

* ``write``: a remote trajectory writer appends one step at a time and creates one item
  per step (chunks of up to 1024 steps / 8 MB per message); in process:
  ``TrajectoryWriter``.
* ``write_batch``: ``append_batch`` of 256 steps, then one ``create_item`` per step.
* ``sample``: batches of 256 from a full uniform table, 4 requests in flight per client;
  in process: ``Table.sample(256)``.
* ``sample+update``: prioritized table of 2**20 items (100 B), sample 256 then update the
  256 priorities and wait for the answer, one cycle at a time (two round trips a cycle).
* ``sample+update pipelined``: the same with 2 sample requests in flight and priority
  updates sent without waiting for their answer.
* ``sample+update one trip``: each sample request carries the previous batch's new
  priorities (``Client.sample(..., update=...)``), which the server applies before
  sampling; one round trip a cycle and one request at a time, so every batch sees every
  earlier update and every update's errors are raised. Bound by latency.
* ``sample+update one trip x2``: a learner's loop as the library offers it:
  ``for batch in client.sample_iterator(..., in_flight=2)`` with
  ``it.update_priorities(keys, new_priorities)``. Each update travels with the next
  request (one message a cycle, errors raised from ``next``) and reaches the table before
  the sample requested two batches later, while one request stays in flight for the
  learner's compute to hide. This is the row checked against the 1.9k cycles/s target.

In process every ``sample+update`` row runs ``Table.sample`` then
``Table.update_priorities`` on the same table.

Single remote calls, with the inputs a user's loop passes:

* ``insert one row``: ``client.insert("gym", row, priorities=1.0)`` once per row of a
  gymnasium loop (``np.float32[4]`` observation, ``np.int64`` action, ``np.float64``
  reward, ``np.bool_`` or ``bool`` done) into a prioritized table; one round trip per
  row, returning its key (streaming single steps is a trajectory writer's job: the
  ``write`` rows). In process: ``Table.insert(row, priorities=1.0)``.
* ``update_priorities 256``: ``client.update_priorities("prio", keys, priorities)`` of 256
  keys, awaited (one round trip per call).

With ``--reverb-python`` (default: ``$RLREPLAY_REVERB_PYTHON``, else
``/tmp/reverbenv/bin/python`` when it exists) the same calls are measured on Reverb in the
same run by ``benchmarks/anchors/reverb_calls.py`` and printed beside ours (the learner
loop against Reverb's own, a streamed ``TrajectoryDataset``, is measured by
``benchmarks/bench_reverb_compat.py``). For every
1-client row the CPU time of the server process and of the client process per operation is
printed too (all their threads, ZeroMQ's included): on a loaded machine it says what a free
core would give.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from rlreplay.runtime.stop_flag import StopFlag

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rlreplay
from benchmarks.children import reply_from
from rlreplay import Prioritized, Table, TrajectoryWriter

CTX = mp.get_context("spawn")
SIZES = {"100B": 24, "4KB": 1023, "40KB": 10239}  # float32 obs length; + 4 B reward
CAPACITY = {"100B": 1 << 20, "4KB": 1 << 15, "40KB": 1 << 12}
BATCH = 256
PRIO_SIZE = 1 << 20
GYM_SIGNATURE = {"obs": ((4,), "float32"), "action": "int64", "reward": "float32", "done": "bool"}
TICK = os.sysconf("SC_CLK_TCK")


def signature(size: str) -> dict:
    return {"obs": ((SIZES[size],), "float32"), "reward": "float32"}


def item_bytes(size: str) -> int:
    return SIZES[size] * 4 + 4


def make_tables() -> list[Table]:
    tables = [Table(s, signature=signature(s), max_size=CAPACITY[s], seed=0) for s in SIZES]
    tables.append(
        Table("prio", signature=signature("100B"), max_size=PRIO_SIZE, sampler=Prioritized(0.6))
    )
    tables.append(
        Table("gym", signature=GYM_SIGNATURE, max_size=1 << 16, sampler=Prioritized(0.6))
    )
    return tables


def prefill(table: Table) -> None:
    if table.name == "gym":
        return  # the insert workloads fill it
    n, chunk = table.max_size, min(table.max_size, 4096)
    dim = table.store.signature["obs"].shape[0]
    rng = np.random.default_rng(0)
    block = {"obs": rng.random((chunk, dim), dtype=np.float32), "reward": np.ones(chunk, "f4")}
    for _ in range(n // chunk):
        table.insert(block, priorities=rng.random(chunk) + 0.01)


def serve(out, stop, bind) -> None:
    tables = make_tables()
    for t in tables:
        prefill(t)
    server = rlreplay.Server(tables, bind=bind).start()
    out.put(server.address)
    while not stop.is_set():
        time.sleep(0.05)
    server.stop()


def gym_rows(n: int) -> list[dict]:
    """Rows as a gymnasium loop gives them: numpy scalars, numpy and Python bools."""
    rng = np.random.default_rng(3)
    return [
        {
            "obs": rng.random(4, dtype=np.float32),
            "action": np.int64(i % 2),
            "reward": np.float64(1.0),
            "done": np.bool_(i % 50 == 49) if i % 2 else bool(i % 50 == 49),
        }
        for i in range(n)
    ]


def process_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def steps_block(size: str, n: int) -> dict:
    rng = np.random.default_rng(1)
    return {"obs": rng.random((n, SIZES[size]), dtype=np.float32), "reward": np.ones(n, "f4")}


# ------------------------------------------------------------ client workloads
def work(kind: str, target, size: str, duration: float) -> int:
    """Run one workload for ``duration`` seconds; returns items (or cycles) done."""
    block = steps_block(size if size in SIZES else "100B", BATCH)
    steps = [{"obs": block["obs"][i], "reward": block["reward"][i]} for i in range(BATCH)]
    done = 0
    end = time.perf_counter() + duration
    if kind == "insert one row":
        insert = target()
        rows = gym_rows(BATCH)
        while time.perf_counter() < end:
            for row in rows:
                insert(row)
            done += BATCH
    elif kind == "update_priorities 256":
        update, keys = target()
        prios = np.random.default_rng(2).random(len(keys)) + 0.01
        while time.perf_counter() < end:
            update(keys, prios)
            done += 1
    elif kind == "write":
        writer = target()
        while time.perf_counter() < end:
            for st in steps:
                writer.append(st)
                writer.create_item(size)
            done += BATCH
        writer.flush()
        writer.close()
    elif kind == "write_batch":
        writer = target()
        while time.perf_counter() < end:
            writer.append_batch(block)
            for i in range(BATCH):
                writer.create_item(size, start=i - BATCH)
            done += BATCH
        writer.flush()
        writer.close()
    elif kind == "sample":
        for batch in target():
            done += len(batch)
            if time.perf_counter() >= end:
                break
    elif kind == "sample+update":
        sample, update = target()
        rng = np.random.default_rng(2)
        while time.perf_counter() < end:
            s = sample()
            update(s.info.keys, rng.random(len(s)) + 0.01)
            done += 1
    elif kind == "sample+update pipelined":
        batches, update = target()
        rng = np.random.default_rng(2)
        for s in batches:
            update(s.info.keys, rng.random(len(s)) + 0.01)
            done += 1
            if time.perf_counter() >= end:
                break
    elif kind == "sample+update one trip":
        sample = target()
        rng = np.random.default_rng(2)
        update = None
        while time.perf_counter() < end:
            s = sample(update)
            update = (s.info.keys, rng.random(len(s)) + 0.01)
            done += 1
    elif kind == "sample+update one trip x2":
        it = target()
        rng = np.random.default_rng(2)
        for s in it:
            it.update_priorities(s.info.keys, rng.random(len(s)) + 0.01)
            done += 1
            if time.perf_counter() >= end:
                break
        it.close()
    return done


def remote_target(client: rlreplay.Client, kind: str, size: str):
    if kind == "insert one row":
        return lambda: lambda r: client.insert("gym", r, priorities=1.0)
    if kind == "update_priorities 256":
        keys = client.sample("prio", BATCH).info.keys
        return lambda: (lambda k, p: client.update_priorities("prio", k, p), keys)
    if kind in ("write", "write_batch"):
        history = BATCH if kind == "write_batch" else None
        chunk = min(1024, max(BATCH, (8 << 20) // item_bytes(size)))
        return lambda: client.trajectory_writer(
            size, chunk_steps=chunk, max_in_flight=4, history=history
        )
    if kind == "sample":
        it = client.sample_iterator(size, BATCH, in_flight=4)
        return lambda: it
    if kind == "sample+update pipelined":
        it = client.sample_iterator("prio", BATCH, in_flight=2)
        return lambda: (it, lambda k, p: client.update_priorities("prio", k, p, wait=False))
    if kind == "sample+update one trip":
        return lambda: lambda update: client.sample("prio", BATCH, update=update)
    if kind == "sample+update one trip x2":
        return lambda: client.sample_iterator("prio", BATCH, in_flight=2)
    return lambda: (
        lambda: client.sample("prio", BATCH),
        lambda k, p: client.update_priorities("prio", k, p),
    )


def client_proc(address, kind, size, duration, go, out) -> None:
    client = rlreplay.Client(address)
    client.ping()
    target = remote_target(client, kind, size)
    out.put(("ready", 0, 0.0, 0.0))
    go.wait()
    start, cpu = time.perf_counter(), process_cpu_s(os.getpid())
    try:
        done = work(kind, target, size, duration)
    except Exception as exc:  # reported, so the benchmark fails instead of hanging
        out.put(("error", f"{type(exc).__name__}: {exc}", 0.0, 0.0))
        return
    out.put(("done", done, time.perf_counter() - start, process_cpu_s(os.getpid()) - cpu))


SERVER_PID: list[int] = []  # the server process, for its CPU time
CPU: dict = {}  # (kind, size) -> (server, client) CPU seconds per operation, 1 client


def remote(address: str, kind: str, size: str, clients: int, duration: float) -> float:
    out, go = CTX.Queue(), StopFlag(CTX)
    procs = [
        CTX.Process(target=client_proc, args=(address, kind, size, duration, go, out))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        assert out.get(timeout=60)[0] == "ready"
    server_cpu = process_cpu_s(SERVER_PID[0]) if SERVER_PID else 0.0
    go.set()
    results = [out.get(timeout=duration + 120) for _ in procs]
    server_cpu = process_cpu_s(SERVER_PID[0]) - server_cpu if SERVER_PID else 0.0
    for p in procs:
        p.join(30)
    failed = [r[1] for r in results if r[0] != "done"]
    failed += [f"no work done in {r[2]:.3g}s" for r in results if r[0] == "done" and r[1] == 0]
    if failed:
        raise RuntimeError(f"{kind} {size} x{clients} failed: {failed[0]}")
    done = sum(r[1] for r in results)
    if clients == 1:
        CPU[(kind, size)] = (server_cpu / done, results[0][3] / done)
    return done / max(r[2] for r in results)


def local(tables: dict, kind: str, size: str, duration: float) -> float:
    learner = kind.startswith("sample+update") or kind == "update_priorities 256"
    table = tables["prio" if learner else size]
    if kind == "insert one row":
        target = lambda: lambda r: table.insert(r, priorities=1.0)  # noqa: E731
    elif kind == "update_priorities 256":
        keys = table.sample(BATCH).info.keys
        target = lambda: (table.update_priorities, keys)  # noqa: E731
    elif kind in ("write", "write_batch"):
        history = BATCH if kind == "write_batch" else 1
        target = lambda: TrajectoryWriter(table, history=history)  # noqa: E731
    elif kind == "sample":

        def batches():
            while True:
                yield table.sample(BATCH)

        target = batches
    elif kind == "sample+update":
        target = lambda: (lambda: table.sample(BATCH), table.update_priorities)  # noqa: E731
    elif kind == "sample+update one trip":

        def sample(update):
            if update is not None:
                table.update_priorities(*update)
            return table.sample(BATCH)

        target = lambda: sample  # noqa: E731
    elif kind == "sample+update one trip x2":
        target = lambda: LocalLearnerStream(table)  # noqa: E731
    else:

        def pipelined():
            def batches():
                while True:
                    yield table.sample(BATCH)

            return batches(), table.update_priorities

        target = pipelined
    start = time.perf_counter()
    done = work(kind, target, size, duration)
    return done / (time.perf_counter() - start)


class LocalLearnerStream:
    """In process, what ``SampleIterator`` with ``update_priorities`` does remotely."""

    def __init__(self, table: Table):
        self.table = table

    def __iter__(self):
        return self

    def __next__(self):
        return self.table.sample(BATCH)

    def update_priorities(self, keys, priorities) -> None:
        self.table.update_priorities(keys, priorities)

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------ main
LEARNER_KINDS = (
    "sample+update",
    "sample+update pipelined",
    "sample+update one trip",
    "sample+update one trip x2",
)
SINGLE_CALLS = ("insert one row", "update_priorities 256")
# Reverb's figures from earlier runs on this machine (issue table), used when Reverb is not
# measured in the same run: client.insert 2.3k-2.7k rows/s, update of 256 1.7k-3.3k/s.
REVERB_EARLIER = {"insert_rows_per_s": 2_700, "update_256_per_s": 3_300}
TARGETS = {  # (kind, size, clients) -> (target, unit)
    # the learner loop over TCP
    ("sample+update one trip x2", "100B", 1): (5_000, "cycles/s"),
    ("write", "100B", 1): (175_000, "steps/s"),
    ("sample", "100B", 1): (175_000, "items/s"),
    ("sample", "40KB", 1): (1e9, "B/s"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per measurement")
    parser.add_argument("--quick", action="store_true", help="one client count, 0.3 s each")
    parser.add_argument("--only", default=None, help="run workloads whose name contains this")
    parser.add_argument("--ipc", action="store_true", help="Unix socket instead of TCP loopback")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="measure each cell this many times; report median"
    )
    parser.add_argument(
        "--clients", default=None, help="client process counts, e.g. 1 or 1,2,4 (default 1,2,4)"
    )
    parser.add_argument(
        "--reverb-python",
        default=os.environ.get("RLREPLAY_REVERB_PYTHON", "/tmp/reverbenv/bin/python"),
        help="interpreter with dm-reverb installed, to measure Reverb's calls in the same run",
    )
    args = parser.parse_args()
    duration = 0.3 if args.quick else args.duration
    client_counts = (1,) if args.quick else (1, 2, 4)
    if args.clients:
        client_counts = tuple(int(n) for n in args.clients.split(","))

    out, stop = CTX.Queue(), StopFlag(CTX)
    transport = "ipc" if args.ipc else "tcp"
    bind = f"ipc:///tmp/rlreplay-bench-{os.getpid()}.sock" if args.ipc else "127.0.0.1"
    out_path = args.out or str(Path(__file__).parent / "results" / f"bench_net_{transport}.json")
    server = CTX.Process(target=serve, args=(out, stop, bind), daemon=True)
    server.start()
    SERVER_PID.append(server.pid)
    tables = {t.name: t for t in make_tables()}
    for t in tables.values():
        prefill(t)
    address = reply_from(server, out, 300)

    plan = [(k, s) for k in ("write", "write_batch", "sample") for s in SIZES]
    plan += [(SINGLE_CALLS[0], "gym"), (SINGLE_CALLS[1], "100B")]
    plan += [(k, "100B") for k in LEARNER_KINDS]
    if args.only:
        plan = [(k, s) for k, s in plan if args.only in f"{k} {s}"]
    rows = []
    try:
        for kind, size in plan:
            loc = local(tables, kind, size, duration)
            row = {"workload": kind, "item": size, "in_process": loc, "remote": {}, "runs": {}}
            for n in client_counts:
                runs = [remote(address, kind, size, n, duration) for _ in range(args.repeat)]
                row["runs"][n] = runs
                row["remote"][n] = float(np.median(runs))
            row["load_average"] = os.getloadavg()
            if (kind, size) in CPU:
                row["cpu_us_per_op"] = {
                    "server": CPU[kind, size][0] * 1e6,
                    "client": CPU[kind, size][1] * 1e6,
                }
            rows.append(row)
            print_row(row, client_counts)
    finally:
        stop.set()
        server.join(30)
        if server.is_alive():
            server.kill()
    reverb = None
    if any(k in SINGLE_CALLS for k, _ in plan):
        reverb = reverb_anchor(args.reverb_python, duration)
    report = {
        "reverb": reverb,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "transport": transport,
        "load_average_at_end": os.getloadavg(),
        "duration_s": duration,
        "batch": BATCH,
        "rows": rows,
        "targets": check_targets(rows) + reverb_lines(rows, reverb),
    }
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out_path} (transport {transport}, load average {os.getloadavg()})")
    for line in report["targets"]:
        print(line)


HEADER_PRINTED = []


def reverb_anchor(python: str, duration: float) -> dict | None:
    """Reverb's single calls measured now by ``anchors/reverb_calls.py`` (None without an
    interpreter that has Reverb)."""
    if not python or not Path(python).exists():
        return None
    script = Path(__file__).parent / "anchors" / "reverb_calls.py"
    try:
        done = subprocess.run(
            [python, str(script), "--duration", str(duration)],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return None if "skipped" in result else result


def reverb_lines(rows: list[dict], reverb: dict | None) -> list[str]:
    """Our single calls against Reverb's: measured in this run, or the earlier figures."""
    source = "Reverb in this run" if reverb else "Reverb's earlier figures (not measured now)"
    anchor = reverb or REVERB_EARLIER
    pairs = [
        ("insert one row", "insert_rows_per_s", "rows/s"),
        ("update_priorities 256", "update_256_per_s", "calls/s"),
    ]
    lines = []
    for kind, key, unit in pairs:
        row = next((r for r in rows if r["workload"] == kind), None)
        if row is None or key not in anchor:
            continue
        ours = row["remote"][min(row["remote"])]
        lines.append(
            f"{kind}: {ours:,.0f} {unit} vs {source} {anchor[key]:,.0f}: "
            f"{ours / anchor[key]:.1f}x"
        )
    return lines


def row_unit(workload: str) -> str:
    if workload.startswith("sample+update"):
        return "cycles/s"
    if workload.startswith("insert one row"):
        return "rows/s"
    return "calls/s" if workload == "update_priorities 256" else "items/s"


def print_row(row: dict, counts) -> None:
    unit = row_unit(row["workload"])
    if not HEADER_PRINTED:
        cols = ["workload", "item", "unit", "in-process"] + [f"{n} client(s)" for n in counts]
        cols.append("MB/s (1 client)")
        print(f"{cols[0]:<26}" + "  ".join(f"{c:>15}" for c in cols[1:]))
        HEADER_PRINTED.append(True)
    mb = row["remote"][counts[0]] * (item_bytes(row["item"]) / 1e6 if unit == "items/s" else 0)
    cells = [row["workload"], row["item"], unit, f"{row['in_process']:,.0f}"]
    cells += [f"{row['remote'][n]:,.0f}" for n in counts] + [f"{mb:,.0f}"]
    runs = row["runs"][counts[0]]
    if len(runs) > 1:
        cells[-1] += f"  (1 client: {min(runs):,.0f}..{max(runs):,.0f})"
    cells[-1] += f"  load {row['load_average'][0]:.2f}"
    if "cpu_us_per_op" in row:
        cpu = row["cpu_us_per_op"]
        cells[-1] += f"  cpu/op: server {cpu['server']:.0f} us, client {cpu['client']:.0f} us"
    print(f"{cells[0]:<26}" + "  ".join(f"{c:>15}" for c in cells[1:]), flush=True)


def check_targets(rows: list[dict]) -> list[str]:
    lines = []
    for (kind, size, n), (target, unit) in TARGETS.items():
        row = next((r for r in rows if r["workload"] == kind and r["item"] == size), None)
        if row is None:
            continue
        value = row["remote"][n] * (item_bytes(size) if unit == "B/s" else 1)
        verdict = "PASS" if value >= target else "MISS"
        lines.append(f"{verdict} {kind} {size} x{n}: {value:,.0f} {unit} (target {target:,.0f})")
    return lines


if __name__ == "__main__":
    main()
