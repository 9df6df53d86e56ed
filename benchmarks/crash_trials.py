"""Crash trials: a replay server killed (SIGKILL) at random moments while clients insert
and sample and it checkpoints. The newest valid checkpoint must always load and be
consistent, and nothing acknowledged before its moment may be missing.

Run from the repository root::

    python -m benchmarks.crash_trials [--trials 50] [--seed 0] [--store-mib 40]

Each trial starts a server process serving one table of 3-step sequences (a store of
about ``--store-mib`` MiB) with a checkpoint every 0.1 to 0.5 s (drawn per trial), keeping
three; two remote writers (one sequence item per step, episodes of 25 steps) and a
sampler run as threads of this process. At a random moment 0.3 to 2.5 s after they start
(often while a checkpoint streams) the server is killed. Then:

* the newest valid checkpoint is restored (manifest, sizes and checksums checked; a
  temporary directory of a save cut short is ignored);
* every item in it is checked: its steps are consecutive steps of one writer's one
  episode, and no (writer, step) anchors two items;
* every item a writer saw acknowledged before the checkpoint's moment is in it;
* a new server restores the directory (tables and writer streams) and serves a sample.

Prints one row per trial and a summary, and writes ``benchmarks/results/crash_trials.json``.
The helpers (server process, writer and sampler loops, checks) are shared with the tests
(``tests/net/checkpoint_procs.py``, ``tests/net/test_net_crash.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

CTX = mp.get_context("spawn")
START_TIMEOUT_S = 30.0
SPAN = 3  # steps per item
EPISODE = 25  # steps per episode
SIGNATURE = {"obs": {"shape": [3], "dtype": "float32"}, "step": "int64"}
TYPED = ("ServerUnavailableError", "ServerRestartedError", "ReplayTimeoutError",
         "RateLimiterTimeoutError")  # fmt: skip
RESULTS = Path(__file__).resolve().parent / "results" / "crash_trials.json"


def config(max_size: int = 100_000, pad: int = 0) -> dict:
    """One uniform table of sequences of ``SPAN`` steps, large enough never to evict in a
    trial; ``pad`` bytes per step make the store (and its checkpoints) larger."""
    signature = dict(SIGNATURE)
    if pad:
        signature["pad"] = {"shape": [pad], "dtype": "uint8"}
    return {
        "table": [
            {
                "name": "seq",
                "signature": signature,
                "max_size": max_size,
                "layout": {"type": "sequence", "length": SPAN},
                "seed": 3,
            }
        ]
    }


def step(writer: int, i: int, pad: int = 0) -> dict[str, np.ndarray]:
    """Step ``i`` of ``writer``: ``obs = (writer, i, episode)``, ``step = i``."""
    out = {"obs": np.array([writer, i, i // EPISODE], np.float32), "step": np.int64(i)}
    if pad:
        out["pad"] = np.full(pad, i % 251, np.uint8)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ server process
def serve(cfg: dict, port: int, kwargs: dict, out: Any) -> None:
    """Child: serve ``cfg`` on ``port`` until killed (or 300 s); reports its address and
    the checkpoint it restored."""
    from rlreplay.net import Server, tables_from_config

    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    try:
        server = Server(tables_from_config(cfg), port=port, **kwargs).start()
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
        return
    restored = server.checkpoints.restored_from
    out.put(("ok", server.address, None if restored is None else str(restored)))
    deadline = time.monotonic() + 300.0
    while time.monotonic() < deadline:
        time.sleep(0.1)
    server.stop()


def start_server(cfg: dict, port: int, **kwargs: Any) -> tuple[Any, str, str | None]:
    """A server process on ``port``; returns ``(process, address, restored_from)``.

    Raises:
        RuntimeError: if it failed to start (its error's text).
    """
    out = CTX.Queue()
    proc = CTX.Process(target=serve, args=(cfg, port, kwargs, out), daemon=True)
    proc.start()
    try:
        reply = out.get(timeout=START_TIMEOUT_S)
    except Exception:
        kill(proc)
        raise
    if reply[0] != "ok":
        proc.join(5.0)
        raise RuntimeError(reply[1])
    return proc, reply[1], reply[2]


def kill(proc: Any) -> None:
    """``kill -9`` the process and wait for it."""
    if proc.is_alive():
        proc.kill()
    proc.join(10.0)


# ------------------------------------------------------------------ client loops
def write_loop(
    address: str,
    writer: int,
    steps: int,
    budget_s: float,
    stop: Any = None,
    pace_s: float = 0.0,
    pad: int = 0,
) -> tuple:
    """Append ``steps`` steps (one sequence item per step once an episode has ``SPAN``),
    retrying every call the server did not take (a call that raised took nothing), then
    flush; or until ``stop`` is set. Sleeps ``pace_s`` after each step.

    Returns:
        ``("ok", writer, acks, errors, slowest_failure, refused)``: ``acks`` lists
        ``(time.time(), items acknowledged)`` after every change, ``errors`` counts the
        errors seen by type, ``slowest_failure`` is the longest failing call in seconds
        and ``refused`` the chunks the server refused; or ``("error", writer, text, ...)``.
    """
    from rlreplay.errors import InvalidArgumentError, ReplayTimeoutError
    from rlreplay.net import Client

    acks: list[tuple[float, int]] = [(time.time(), 0)]
    errors: dict[str, int] = {}
    slowest_failure = 0.0
    refused = 0
    end = time.monotonic() + budget_s
    client = Client(address, call_timeout=1.0, liveness_s=0.5)
    w = client.trajectory_writer("seq", chunk_steps=16, max_in_flight=4, timeout=1.0)

    def attempt(call: Any) -> bool:
        nonlocal slowest_failure, refused
        while time.monotonic() < end:
            if stop is not None and stop.is_set():
                return False
            start = time.monotonic()
            try:
                call()
                return True
            except ReplayTimeoutError as exc:
                slowest_failure = max(slowest_failure, time.monotonic() - start)
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                time.sleep(0.05)
            except InvalidArgumentError as exc:  # a chunk refused after a restart
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                refused += 1
            finally:
                if w.items_acknowledged != acks[-1][1]:
                    acks.append((time.time(), w.items_acknowledged))
        raise TimeoutError(f"writer {writer} ran out of its {budget_s}s budget")

    try:
        for i in range(steps):
            if not attempt(lambda i=i: w.append(step(writer, i, pad))):
                break
            if i % EPISODE >= SPAN - 1 and not attempt(lambda: w.create_item("seq", 1.0)):
                break
            if (i + 1) % EPISODE == 0:
                w.end_episode()
            if pace_s:
                time.sleep(pace_s)
        else:
            attempt(lambda: w.flush(timeout=2.0))
            acks.append((time.time(), w.items_acknowledged))
        return ("ok", writer, acks, errors, slowest_failure, refused)
    except Exception as exc:
        return ("error", writer, f"{type(exc).__name__}: {exc}", errors, slowest_failure, 0)
    finally:
        # stopped with chunks unacknowledged: they are not stored, and that is fine here
        with contextlib.suppress(Exception):
            w.close(timeout=0.01 if stop is not None and stop.is_set() else 2.0)
        client.close()


def sample_loop(address: str, stop: Any, budget_s: float) -> tuple:
    """Sample until ``stop`` is set; checks every item.

    Returns:
        ``("ok", sampled, bad, errors, slowest_failure)`` (``bad``: inconsistent items),
        or ``("error", text, 0, errors, slowest_failure)``.
    """
    from rlreplay.errors import ReplayTimeoutError
    from rlreplay.net import Client

    client = Client(address, call_timeout=1.0, liveness_s=0.5)
    sampled = bad = 0
    errors: dict[str, int] = {}
    slowest_failure = 0.0
    end = time.monotonic() + budget_s
    try:
        while not stop.is_set() and time.monotonic() < end:
            start = time.monotonic()
            try:
                s = client.sample("seq", 8, timeout=0.5)
            except ReplayTimeoutError as exc:
                slowest_failure = max(slowest_failure, time.monotonic() - start)
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                time.sleep(0.02)
                continue
            bad += int((~items_consistent(s.data["obs"], s.data["step"])).sum())
            sampled += len(s)
        return ("ok", sampled, bad, errors, slowest_failure)
    except Exception as exc:
        return ("error", f"{type(exc).__name__}: {exc}", 0, errors, slowest_failure)
    finally:
        client.close()


# ------------------------------------------------------------------ checks
def items_consistent(obs: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Per item (``obs [n, SPAN, 3]``, ``steps [n, SPAN]``): whether its steps are
    consecutive steps of one writer's one episode."""
    writer, index, episode = obs[..., 0], obs[..., 1], obs[..., 2]
    ok = (writer == writer[:, :1]).all(1) & (episode == episode[:, :1]).all(1)
    ok &= (np.diff(index, axis=1) == 1).all(1) & (steps == index.astype(np.int64)).all(1)
    return ok


def item_anchors(n: int) -> list[int]:
    """Anchor steps of a writer's first ``n`` items (one per step from ``SPAN - 1``
    steps into each episode, anchored ``SPAN - 1`` steps back)."""
    per_episode = EPISODE - SPAN + 1
    return [(j // per_episode) * EPISODE + j % per_episode for j in range(n)]


def check_checkpoint(
    path: str | os.PathLike, acks: dict[int, list[tuple[float, int]]], before: float | None = None
) -> dict[str, Any]:
    """Restore the checkpoint at ``path`` (a directory of checkpoints: the newest valid
    one) and check it: every item consistent, no (writer, step) anchoring two items, and
    every item a writer saw acknowledged before the checkpoint's moment (and before
    ``before``, a ``time.time()``, when given) present.

    Returns:
        ``path`` (the checkpoint restored), ``items``, ``bad`` (inconsistent items),
        ``duplicates``, ``missing`` (acknowledged before the moment but absent),
        ``acked_before`` and ``restore_s``.
    """
    from rlreplay.checkpoint import restore
    from rlreplay.checkpoint.restore import load
    from rlreplay.datasets.table_contents import read_items, step_range

    t0 = time.perf_counter()
    loaded = load(Path(path), False, None, False)
    moment = loaded.manifest["created_unix"]
    if before is not None:
        moment = min(moment, before)
    table = restore(loaded.directory)["seq"]
    restore_s = time.perf_counter() - t0
    records = read_items(table, step_range(table.store, None, None))
    ids = records.anchor_ids[:, None] + np.arange(SPAN)  # a sequence's steps, one lane
    data = table.store.read(ids.reshape(-1))
    obs = data["obs"].reshape(len(ids), SPAN, 3)
    steps = data["step"].reshape(len(ids), SPAN)
    bad = int((~items_consistent(obs, steps)).sum()) if len(obs) else 0
    anchors = obs[:, 0, :2].astype(np.int64) if len(obs) else np.zeros((0, 2), np.int64)
    pairs = anchors[:, 0] * (1 << 32) + anchors[:, 1]
    duplicates = len(pairs) - len(np.unique(pairs))
    missing = acked_before = 0
    for writer, log in acks.items():
        acked = max((n for t, n in log if t < moment), default=0)
        acked_before += acked
        have = set(anchors[anchors[:, 0] == writer, 1].tolist())
        missing += sum(1 for a in item_anchors(acked) if a not in have)
    return {
        "path": str(loaded.directory),
        "items": len(pairs),
        "bad": bad,
        "duplicates": int(duplicates),
        "missing": missing,
        "acked_before": acked_before,
        "restore_s": restore_s,
    }


def check_restart(cfg: dict, directory: Path) -> dict[str, Any]:
    """A server (in this process) restoring ``directory``: the checkpoint it restored,
    the writer streams it holds again and the size of a sample it serves."""
    import rlreplay
    from rlreplay.net import Server, tables_from_config

    server = Server(tables_from_config(cfg), checkpoint_dir=directory).start()
    try:
        client = rlreplay.Client(server.address)
        size = client.info("seq").size
        sampled = len(client.sample("seq", 4, timeout=5.0)) if size else 0
        client.close()
        return {
            "restored": str(server.checkpoints.restored_from),
            "streams": len(server._sessions._entries),
            "sampled": sampled,
        }
    finally:
        server.stop()


# ------------------------------------------------------------------ one trial
def saving(directory: Path) -> bool:
    """Whether a save is under way in ``directory`` (its temporary directory is there)."""
    return directory.is_dir() and any(p.name.startswith(".tmp-") for p in directory.iterdir())


def trial(
    rng: random.Random, root: Path, store_mib: float, kill_range: tuple = (0.3, 2.5)
) -> dict[str, Any]:
    """One trial in a fresh directory under ``root``, the server killed a random number
    of seconds in ``kill_range`` after the clients start; returns its figures."""
    pad = 1024
    max_size = max(20_000, int(store_mib * 2**20 / (pad + 20)))
    cfg = config(max_size, pad)
    every = rng.uniform(0.1, 0.5)
    kill_after = rng.uniform(*kill_range)
    directory = root / f"trial-{rng.randrange(1 << 30)}"
    proc, address, _ = start_server(
        cfg, free_port(), checkpoint_dir=str(directory), checkpoint_every_s=every,
        keep_checkpoints=3,
    )  # fmt: skip
    stop = threading.Event()
    results: dict[str, Any] = {}

    def run(name: str, fn: Any, *args: Any) -> threading.Thread:
        t = threading.Thread(target=lambda: results.__setitem__(name, fn(*args)), daemon=True)
        t.start()
        return t

    threads = [run(f"w{w}", write_loop, address, w, 10**6, 60.0, stop, 0.001, pad)
               for w in (1, 2)]  # fmt: skip
    threads.append(run("sampler", sample_loop, address, stop, 60.0))
    time.sleep(kill_after)
    streaming = saving(directory)
    kill(proc)
    killed_at = time.time()
    time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(30.0)
    row: dict[str, Any] = {
        "every_s": round(every, 3),
        "kill_after_s": round(kill_after, 3),
        "killed_while_saving": streaming or saving(directory),
    }
    acks = {}
    for w in (1, 2):
        status, _, log, _, _, _ = results.get(f"w{w}", ("error", w, "no result", {}, 0, 0))
        if status != "ok":
            row["error"] = f"writer {w}: {log}"
            return row
        acks[w] = log
    sampler = results.get("sampler", ("error", "no result", 0, {}, 0))
    if sampler[0] != "ok" or sampler[2]:
        row["error"] = f"sampler: {sampler[1]} bad={sampler[2]}"
        return row
    row["acked_at_kill"] = sum(max((n for t, n in log if t < killed_at), default=0)
                               for log in acks.values())  # fmt: skip
    from rlreplay.checkpoint import list_checkpoints

    published = list_checkpoints(directory)
    row["checkpoints"] = len(published)
    if not published:
        row["no_checkpoint_yet"] = True
        return row
    try:
        row.update(check_checkpoint(directory, acks))
        row["restart"] = check_restart(cfg, directory)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return row


def failed(row: dict[str, Any]) -> bool:
    return bool(row.get("error") or row.get("bad") or row.get("duplicates") or row.get("missing"))


def run_trials(
    trials: int,
    seed: int,
    store_mib: float,
    root: Path | None = None,
    kill_range: tuple = (0.3, 2.5),
) -> list:
    """Run ``trials`` trials (seeded; see :func:`trial`); returns their rows."""
    rng = random.Random(seed)
    own = root is None
    root = Path(tempfile.mkdtemp(prefix="crash-trials-")) if own else root
    try:
        return [trial(rng, root, store_mib, kill_range) for _ in range(trials)]
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50, help="number of trials")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--store-mib", type=float, default=40.0, help="store size per trial")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument(
        "--append",
        action="store_true",
        help="add these trials to those already in --out (run in batches on a shared "
        "machine, with a new --seed each); the summary covers all of them",
    )
    args = parser.parse_args(argv)
    started = time.time()
    earlier: list = []
    seeds = [args.seed]
    if args.append and args.out.exists():
        old = json.loads(args.out.read_text())
        earlier, seeds = old["trials"], [*old["summary"]["seeds"], args.seed]
    rows = []
    header = (f"{'trial':>5} {'every':>6} {'kill':>6} {'saving':>6} {'ckpts':>5} "
              f"{'items':>6} {'acked':>6} {'missing':>7} {'dup':>4} {'bad':>4} "
              f"{'restore':>8}")  # fmt: skip
    print(header)
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="crash-trials-"))
    try:
        for i in range(args.trials):
            row = trial(rng, root, args.store_mib)
            rows.append(row)
            print(
                f"{i:>5} {row['every_s']:>6.2f} {row['kill_after_s']:>6.2f} "
                f"{'yes' if row['killed_while_saving'] else 'no':>6} "
                f"{row.get('checkpoints', 0):>5} {row.get('items', 0):>6} "
                f"{row.get('acked_before', 0):>6} {row.get('missing', 0):>7} "
                f"{row.get('duplicates', 0):>4} {row.get('bad', 0):>4} "
                f"{row.get('restore_s', 0) * 1000:>6.1f}ms"
                + (f"  ERROR {row['error']}" if row.get("error") else ""),
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    took = round(time.time() - started, 1)
    rows = earlier + rows
    bad = [r for r in rows if failed(r)]
    summary = {
        "trials": len(rows),
        "failed": len(bad),
        "killed_while_saving": sum(bool(r["killed_while_saving"]) for r in rows),
        "without_checkpoint_yet": sum(bool(r.get("no_checkpoint_yet")) for r in rows),
        "items_checked": sum(r.get("items", 0) for r in rows),
        "acked_before_checkpoint_checked": sum(r.get("acked_before", 0) for r in rows),
        "restarts_served": sum(bool(r.get("restart", {}).get("sampled")) for r in rows),
        "max_restore_s": max((r.get("restore_s", 0.0) for r in rows), default=0.0),
        "store_mib": args.store_mib,
        "seeds": seeds,
        "seconds_this_run": took,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    print(json.dumps(summary, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "trials": rows}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
