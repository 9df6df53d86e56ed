"""Checkpoints of a large prioritized table while it serves: pauses, throughput, memory.

Run: python -m benchmarks.bench_checkpoint [--gb 4] [--row-kb 16 0.25] [--dir DIR]
     python -m benchmarks.bench_checkpoint --server [--items N] [--rounds 2]

A rows table of ``--gb`` GB (rows of ``--row-kb`` KB of uint8 plus a float32 reward; a
``Prioritized(0.6)`` sampler, as PER uses; one run per row size: the per-item state the
save copies under the lock grows with the number of items, the columns with the bytes)
is filled, then served by two threads: an
actor inserting one row per call (as a gymnasium loop does) and a learner sampling 32
items and updating their priorities. While they run, the main thread saves a
checkpoint. Figures:

* ``held_up_ms``: the longest any table call took while the checkpoint was written, next
  to the longest in the same load without a checkpoint (``baseline_ms``: the GIL and the
  two cores shared by both threads set that floor; on a machine busy with other work a
  thread may also wait for a core); ``capture_held_ms`` and ``chunk_held_ms``: the
  longest the checkpoint itself held the store's lock (the per-item state capture; one
  chunk's copy), what the checkpoint alone holds calls up by;
* ``save_gbps``: checkpoint bytes over the save's wall time (fsync included), next to
  this disk's write speed (``disk_write_gbps``: one file of the same size, fsynced);
* ``restore_gbps``: bytes over the wall time of ``rlreplay.checkpoint.restore`` from
  files evicted from the page cache (``posix_fadvise(DONTNEED)``), next to reading the
  same files cold (``disk_read_gbps``);
* ``mmap_first_sample_s``: a memory-mapped restore from cold files until its first
  sample of 32 returns;
* ``full_*`` and ``incremental_*``: a full checkpoint into a new directory, then
  ``--new-fraction`` of the rows inserted anew and a second checkpoint into the same
  directory (it links the chunks no insert changed), both without the load: bytes
  written and wall seconds, and their ratios;
* ``load_average``: the machine's load average during the run (others' work included);
* ``peak_extra_mb``: the process's peak resident memory during the save above its
  resident memory before (``/proc/self/clear_refs``), ``aside_peak_mb``, the rows
  copied aside because the actor overwrote them before they were streamed, and
  ``state_peak_mb``, the per-item state the save held in memory at once
  (``SaveStats.state_peak_bytes``: slice buffers and changed entries for a table of
  many items, whose state goes to its files slice by slice).

Prints a table and writes ``benchmarks/results/bench_checkpoint.json``. The checkpoint
is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script from a checkout: find the package beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rlreplay
from rlreplay import Prioritized, Table, checkpoint

TARGETS = {"held_up_ms": 50.0, "mmap_first_sample_s": 1.0}


def status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def evict(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache, so the next read comes from disk."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def build(gb: float, row_bytes: int) -> Table:
    rows = max(1024, int(gb * 2**30) // (row_bytes + 4))
    table = Table(
        "replay",
        signature={"obs": ((row_bytes,), "uint8"), "reward": "float32"},
        max_size=rows,
        sampler=Prioritized(0.6),
        seed=0,
    )
    batch = 4096
    obs = np.empty((batch, row_bytes), np.uint8)
    for first in range(0, rows, batch):
        n = min(batch, rows - first)
        obs[:n] = (np.arange(first, first + n) % 251)[:, None]
        table.insert(
            {"obs": obs[:n], "reward": np.ones(n, np.float32)},
            np.random.default_rng(first).random(n) + 0.1,
        )
    return table


class Load:
    """An actor and a learner thread using the table; every call's duration recorded."""

    def __init__(self, table: Table, row_bytes: int):
        self.table = table
        self.stop = threading.Event()
        self.calls: dict[str, list[tuple[float, float]]] = {"insert": [], "sample": []}
        self.row = {"obs": np.zeros(row_bytes, np.uint8), "reward": np.float32(1.0)}
        self.threads = [
            threading.Thread(target=self._actor, daemon=True),
            threading.Thread(target=self._learner, daemon=True),
        ]

    def _actor(self) -> None:
        out, row, clock = self.calls["insert"], self.row, time.perf_counter
        while not self.stop.is_set():
            t0 = clock()
            self.table.insert(row)
            out.append((t0, clock() - t0))
            time.sleep(0.0002)  # an environment step's worth of other work

    def _learner(self) -> None:
        out, clock = self.calls["sample"], time.perf_counter
        prios = np.full(32, 0.5)
        while not self.stop.is_set():
            t0 = clock()
            s = self.table.sample(32)
            self.table.update_priorities(s.info.keys, prios)
            out.append((t0, clock() - t0))
            time.sleep(0.001)  # a gradient step's worth of other work

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def worst(self, t0: float, t1: float) -> tuple[float, float, int]:
        """Longest and 99th-percentile call duration (ms) of calls that overlapped
        ``[t0, t1]``, and how many there were."""
        d = [dur for calls in self.calls.values() for s, dur in calls if s <= t1 and s + dur >= t0]
        if not d:
            return 0.0, 0.0, 0
        return 1e3 * max(d), 1e3 * float(np.percentile(d, 99)), len(d)


def disk_write_gbps(directory: Path, nbytes: int) -> float:
    data = np.ones(min(nbytes, 1 << 30), np.uint8)
    path = directory / "disk_write_probe.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // len(data))):
            f.write(memoryview(data))
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    size = path.stat().st_size
    path.unlink()
    return size / dt / 1e9


def disk_read_gbps(paths: list[Path]) -> float:
    evict(paths)
    total = sum(p.stat().st_size for p in paths)
    buf = bytearray(8 << 20)
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return total / (time.perf_counter() - t0) / 1e9


def incremental(table: Table, root: Path, fraction: float) -> dict:
    """A full checkpoint into a new directory, then ``fraction`` of the rows inserted
    anew, then a second checkpoint into the same directory (it links the chunks no
    insert changed); no other load. Bytes written and wall seconds of each."""
    directory = root / "incremental"
    figures = {}
    for name in ("full", "incremental"):
        if name == "incremental":
            n = max(1, int(table.store.capacity * fraction))
            row_bytes = table.store.columns["obs"].shape[1]
            for first in range(0, n, 4096):
                k = min(4096, n - first)
                obs = np.full((k, row_bytes), 7, np.uint8)
                table.insert({"obs": obs, "reward": np.ones(k, np.float32)})
        stats = checkpoint.SaveStats()
        t0 = time.perf_counter()
        checkpoint.save(table, directory, stats=stats)
        figures[f"{name}_save_s"] = time.perf_counter() - t0
        figures[f"{name}_written_gb"] = stats.bytes / 1e9
        figures[f"{name}_reused_gb"] = stats.reused_bytes / 1e9
    shutil.rmtree(directory)
    figures["incremental_bytes_ratio"] = (
        figures["incremental_written_gb"] / figures["full_written_gb"]
    )
    figures["incremental_time_ratio"] = figures["incremental_save_s"] / figures["full_save_s"]
    return figures


def run(args: argparse.Namespace) -> dict:
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench_ckpt_"))
    root.mkdir(parents=True, exist_ok=True)
    row_bytes = int(args.row_kb * 1024)
    t0 = time.perf_counter()
    table = build(args.gb, row_bytes)
    fill_s = time.perf_counter() - t0
    load_before = os.getloadavg()[0]
    out: dict = {
        "table_gb": table.store.nbytes / 2**30,
        "rows": table.store.capacity,
        "row_bytes": row_bytes + 4,
        "construct_and_fill_s": fill_s,
    }
    try:
        with Load(table, row_bytes) as load:  # the same load without a checkpoint
            time.sleep(args.baseline_s)
            b0 = time.perf_counter()
            time.sleep(args.baseline_s)
            out["baseline_ms"], out["baseline_p99_ms"], _ = load.worst(b0, time.perf_counter())
        rss0 = status_kb("VmRSS")
        peak_ok = reset_peak_rss()
        stats = checkpoint.SaveStats()
        with Load(table, row_bytes) as load:
            time.sleep(0.2)
            s0 = time.perf_counter()
            path = checkpoint.save(table, root, keep=1, stats=stats)
            s1 = time.perf_counter()
            time.sleep(0.05)
        out["held_up_ms"], out["held_up_p99_ms"], out["calls_during_save"] = load.worst(s0, s1)
        out["inserts_during_save"] = sum(1 for s, _ in load.calls["insert"] if s0 <= s <= s1)
        out["peak_extra_mb"] = (status_kb("VmHWM") - rss0) / 1024 if peak_ok else None
        out["aside_peak_mb"] = stats.aside_peak_bytes / 2**20
        out["state_peak_mb"] = stats.state_peak_bytes / 2**20
        out["capture_held_ms"] = 1e3 * stats.capture_held_s
        out["chunk_held_ms"] = 1e3 * stats.chunk_held_s
        out["save_s"] = s1 - s0
        out["checkpoint_gb"] = stats.bytes / 1e9
        out["save_gbps"] = stats.bytes / (s1 - s0) / 1e9
        files = sorted(path.glob("*.npy"))
        out["disk_write_gbps"] = disk_write_gbps(root, stats.bytes)
        out["disk_read_gbps"] = disk_read_gbps(files)
        out.update(incremental(table, root, args.new_fraction))
        del table, load
        evict(files)
        r0 = time.perf_counter()
        restored = checkpoint.restore(path)["replay"]
        out["restore_s"] = time.perf_counter() - r0
        out["restore_gbps"] = stats.bytes / out["restore_s"] / 1e9
        assert restored.size == restored.max_size
        del restored
        evict(files)
        m0 = time.perf_counter()
        mapped = checkpoint.restore(path, mmap=True)["replay"]
        mapped.sample(32)
        out["mmap_first_sample_s"] = time.perf_counter() - m0
        del mapped
        out["load_average"] = max(load_before, os.getloadavg()[0])
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return out


ROWS = [
    ("table_gb", "table size (GB)", "{:.2f}"),
    ("construct_and_fill_s", "construction + first fill (s)", "{:.1f}"),
    ("baseline_ms", "longest call, same load, no checkpoint (ms)", "{:.1f}"),
    ("held_up_ms", "longest call during the checkpoint (ms)", "{:.1f}"),
    ("held_up_p99_ms", "p99 call during the checkpoint (ms)", "{:.2f}"),
    ("capture_held_ms", "lock held: per-item state capture (ms)", "{:.1f}"),
    ("chunk_held_ms", "lock held: one chunk copy, longest (ms)", "{:.1f}"),
    ("inserts_during_save", "one-row inserts during the save", "{}"),
    ("save_s", "save wall time (s)", "{:.2f}"),
    ("save_gbps", "save throughput (GB/s)", "{:.2f}"),
    ("disk_write_gbps", "disk write, fsynced (GB/s)", "{:.2f}"),
    ("restore_gbps", "restore throughput, cold files (GB/s)", "{:.2f}"),
    ("disk_read_gbps", "disk read, cold files (GB/s)", "{:.2f}"),
    ("mmap_first_sample_s", "mmap restore to first sample, cold (s)", "{:.3f}"),
    ("peak_extra_mb", "peak extra resident memory during save (MB)", "{:.0f}"),
    ("aside_peak_mb", "rows copied aside, peak (MB)", "{:.1f}"),
    ("state_peak_mb", "per-item state held in memory, peak (MB)", "{:.1f}"),
    ("full_written_gb", "full save, no load: written (GB)", "{:.3f}"),
    ("full_save_s", "full save, no load: wall time (s)", "{:.2f}"),
    ("incremental_written_gb", "second save after new rows: written (GB)", "{:.3f}"),
    ("incremental_reused_gb", "second save: linked from the first (GB)", "{:.3f}"),
    ("incremental_save_s", "second save: wall time (s)", "{:.2f}"),
    ("incremental_bytes_ratio", "second save / full: bytes written", "{:.3f}"),
    ("incremental_time_ratio", "second save / full: wall time", "{:.3f}"),
    ("load_average", "machine load average (2 cores; others' work)", "{:.1f}"),
]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gb", type=float, default=4.0, help="table size in GB")
    p.add_argument(
        "--row-kb",
        type=float,
        nargs="+",
        default=[16.0, 0.25],
        help="KB of uint8 per row, one run per value (16: image-like rows; 0.25: small "
        "rows, so many more items per GB)",
    )
    p.add_argument("--dir", default=None, help="directory for the checkpoint (default: temp)")
    p.add_argument("--baseline-s", type=float, default=1.0, help="seconds of load without")
    p.add_argument(
        "--new-fraction",
        type=float,
        default=0.01,
        help="rows inserted anew before the incremental second checkpoint (0.01: 1%%)",
    )
    p.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "bench_checkpoint.json")
    )
    p.add_argument(
        "--server",
        action="store_true",
        help="instead: a server's clients' longest call while it checkpoints --items small "
        "items, step-wise capture against one dispatcher turn (benchmarks/"
        "checkpoint_server_case.py)",
    )
    p.add_argument("--items", type=int, default=16_519_104, help="items of the --server table")
    p.add_argument("--rounds", type=int, default=2, help="--server checkpoints per way")
    args = p.parse_args(argv)
    if args.server:
        from benchmarks import checkpoint_server_case as case

        result = case.run(args.items, args.rounds, args.baseline_s, args.dir)
        case.report(result)
        out = Path(args.out).with_name("bench_checkpoint_server.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        return
    runs = []
    for row_kb in args.row_kb:
        runs.append(run(argparse.Namespace(**{**vars(args), "row_kb": row_kb})))
    heads = [f"{r['row_bytes']} B rows" for r in runs]
    print(f"{'figure':<48}" + "".join(f"{h:>16}" for h in heads) + "  target")
    for key, label, fmt in ROWS:
        cells = []
        for r in runs:
            value = r.get(key)
            cells.append(f"{'n/a' if value is None else fmt.format(value):>16}")
        target = TARGETS.get(key)
        mark = ""
        if target is not None:
            ok = all(r.get(key) is not None and r[key] <= target for r in runs)
            mark = f"<= {target:g}" + (" ok" if ok else " MISSED")
        print(f"{label:<48}" + "".join(cells) + f"  {mark}")
    result = {
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "rlreplay": rlreplay.__version__,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "options": vars(args),
        "targets": TARGETS,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
