"""Soak: many client processes inserting and sampling a checkpointing server for minutes.

Run from the repository root::

    python -m benchmarks.soak [--clients 32] [--minutes 10] [--checkpoint-every 30]

A server process serves one prioritized table (transitions of a 64-float observation)
held at ``--samples-per-insert`` by a ``SampleToInsertRatio`` limiter, and saves a
checkpoint every ``--checkpoint-every`` seconds (keeping two). Half the clients are
actors (``insert`` of 16 rows per call), half learners (``sample`` of 64 carrying the
previous batch's new priorities); an insert returns its keys once acknowledged, so
its latency is a round trip; every call has a 2 s timeout, and a call the limiter
holds back that long counts as a blocked call, not a failure. Reported:

* deadlocks: a client that made no call at all (answered or timed out) for 10 s;
* the ratio held: samples per insert observed against the limiter's;
* memory: the server's resident size over time (first, last, peak);
* p50/p99/max latencies of inserts and samples, over the whole run and during
  checkpoints (a call overlapping the time from a checkpoint's moment to its publication),
  and how many checkpoints were published.

Prints a table and writes ``benchmarks/results/soak.json``. The defaults are the soak's
(32 processes, 10 minutes); on a small shared machine run it short, e.g.
``--clients 8 --minutes 0.75 --checkpoint-every 10``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CTX = mp.get_context("spawn")
RESULTS = Path(__file__).resolve().parent / "results" / "soak.json"
OBS = 64
STALL_S = 10.0


def table_config(spi: float) -> dict:
    return {
        "table": [
            {
                "name": "replay",
                "signature": {"obs": {"shape": [OBS], "dtype": "float32"}, "reward": "float32"},
                "max_size": 200_000,
                "sampler": {"type": "Prioritized", "priority_exponent": 0.6},
                "rate_limiter": {
                    "type": "SampleToInsertRatio",
                    "samples_per_insert": spi,
                    "min_size_to_sample": 1000,
                    "error_buffer": 20_000.0,
                },
                "seed": 1,
            }
        ]
    }


def serve(cfg: dict, directory: str, every: float, out: Any) -> None:
    """Child: the server, until killed."""
    from rlreplay.net import Server, tables_from_config

    server = Server(
        tables_from_config(cfg),
        checkpoint_dir=directory,
        checkpoint_every_s=every,
        keep_checkpoints=2,
    ).start()
    out.put(server.address)
    while True:
        time.sleep(1.0)


def client(role: str, address: str, end: float, beats: Any, slot: int, out: Any) -> None:
    """Child: an actor or a learner until ``end`` (a ``time.time()``); reports
    ``(role, [(start, seconds, op, outcome)], errors)``."""
    from rlreplay.errors import RateLimiterTimeoutError, ReplayTimeoutError
    from rlreplay.net import Client

    rng = np.random.default_rng(slot)
    c = Client(address, call_timeout=5.0)
    calls: list[tuple[float, float, int, int]] = []  # start, seconds, op (0 insert), outcome
    errors: dict[str, int] = {}
    rows = {"obs": rng.standard_normal((16, OBS)).astype(np.float32), "reward": np.ones(16, "f4")}
    update = None
    while time.time() < end:
        start = time.time()
        t0 = time.perf_counter()
        outcome = 0
        try:
            if role == "actor":
                c.insert("replay", rows, timeout=2.0)  # a round trip each
            else:
                s = c.sample("replay", 64, timeout=2.0, update=update)
                update = (s.info.keys, rng.uniform(0.1, 2.0, len(s)))
        except RateLimiterTimeoutError:
            outcome = 1  # held back by the limiter: the ratio at work
        except ReplayTimeoutError as exc:
            outcome = 2
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            update = None
        calls.append((start, time.perf_counter() - t0, 0 if role == "actor" else 1, outcome))
        beats[slot] = time.time()
    try:
        c.close()
    except ReplayTimeoutError as exc:  # rows the limiter held back at the end
        errors[f"at close: {type(exc).__name__}"] = 1
    out.put((role, np.array(calls), errors))


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def percentiles(seconds: np.ndarray) -> dict[str, float]:
    if not len(seconds):
        return {"n": 0}
    ms = seconds * 1000
    return {
        "n": len(ms),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
    }


def checkpoint_windows(directory: Path) -> list[tuple[float, float]]:
    """(moment, publication) of every checkpoint still in ``directory``."""
    out = []
    for path in sorted(directory.glob("ckpt-*")):
        manifest = json.loads((path / "manifest.json").read_text())
        out.append((manifest["created_unix"], path.stat().st_mtime))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32, help="client processes")
    parser.add_argument("--minutes", type=float, default=10.0, help="duration")
    parser.add_argument("--checkpoint-every", type=float, default=30.0, help="seconds")
    parser.add_argument("--samples-per-insert", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="soak-"))
    out = CTX.Queue()
    server = CTX.Process(
        target=serve,
        args=(table_config(args.samples_per_insert), str(directory), args.checkpoint_every, out),
        daemon=True,
    )
    server.start()
    address = out.get(timeout=60.0)
    duration = args.minutes * 60.0
    start = time.time()
    end = start + duration
    beats = CTX.Array("d", [start] * args.clients, lock=False)
    roles = ["actor" if i % 2 == 0 else "learner" for i in range(args.clients)]
    procs = [
        CTX.Process(target=client, args=(role, address, end, beats, i, out), daemon=True)
        for i, role in enumerate(roles)
    ]
    for p in procs:
        p.start()
    memory: list[tuple[float, int]] = []
    windows: list[tuple[float, float]] = []
    stalls: list[dict] = []
    from rlreplay.net import Client

    watcher = Client(address, call_timeout=10.0)
    try:
        while time.time() < end:
            time.sleep(min(1.0, max(0.0, end - time.time())))
            now = time.time()
            memory.append((round(now - start, 1), rss_of(server.pid)))
            for i, beat in enumerate(beats):
                if now - beat > STALL_S and now - start > STALL_S:
                    stalls.append({"client": i, "role": roles[i], "silent_s": round(now - beat, 1)})
            for w in checkpoint_windows(directory):
                if w not in windows:
                    windows.append(w)
        results = [out.get(timeout=60.0) for _ in procs]
        info = watcher.server_info("replay")["replay"]
    finally:
        watcher.close()
        for p in procs:
            p.join(10.0)
            if p.is_alive():
                p.kill()
        server.kill()
        server.join(10.0)
        shutil.rmtree(directory, ignore_errors=True)
    calls = np.concatenate([r[1] for r in results if len(r[1])])
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r[2].items():
            errors[k] = errors.get(k, 0) + v
    answered = calls[calls[:, 3] == 0]
    in_ckpt = np.zeros(len(answered), bool)
    for moment, published in windows:
        in_ckpt |= (answered[:, 0] + answered[:, 1] >= moment) & (answered[:, 0] <= published)
    rss = [m for _, m in memory]
    summary = {
        "clients": args.clients,
        "minutes": args.minutes,
        "checkpoint_every_s": args.checkpoint_every,
        "checkpoints_published": len(windows),
        "deadlocks": stalls,
        "samples_per_insert_target": args.samples_per_insert,
        "samples_per_insert_observed": round(info["samples"] / max(1, info["inserts"]), 3),
        "inserts": int(info["inserts"]),
        "samples": int(info["samples"]),
        "table_size": int(info["size"]),
        "calls_blocked_by_limiter": int((calls[:, 3] == 1).sum()),
        "calls_failed": errors,
        "insert": percentiles(answered[answered[:, 2] == 0, 1]),
        "sample": percentiles(answered[answered[:, 2] == 1, 1]),
        "insert_during_checkpoints": percentiles(answered[(answered[:, 2] == 0) & in_ckpt, 1]),
        "sample_during_checkpoints": percentiles(answered[(answered[:, 2] == 1) & in_ckpt, 1]),
        "server_rss_mib": {
            "first": round(rss[0] / 2**20, 1) if rss else None,
            "last": round(rss[-1] / 2**20, 1) if rss else None,
            "peak": round(max(rss) / 2**20, 1) if rss else None,
        },
        "server_rss_over_time": [
            (t, round(m / 2**20, 1)) for t, m in memory[:: max(1, len(memory) // 60)]
        ],
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    for key in ("insert", "sample", "insert_during_checkpoints", "sample_during_checkpoints"):
        p = summary[key]
        print(f"{key:<28} n={p.get('n', 0):>7} p50={p.get('p50_ms', '-'):>8} ms "
              f"p99={p.get('p99_ms', '-'):>8} ms max={p.get('max_ms', '-'):>8} ms")  # fmt: skip
    for key in ("checkpoints_published", "deadlocks", "samples_per_insert_target",
                "samples_per_insert_observed", "calls_blocked_by_limiter", "calls_failed",
                "server_rss_mib"):  # fmt: skip
        print(f"{key:<28} {summary[key]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    return 1 if stalls else 0


if __name__ == "__main__":
    sys.exit(main())
