"""Processes of the checkpoint, restart and crash tests (importable by spawned children),
and the checks they share with ``benchmarks/crash_trials.py``.

Steps carry who wrote them: ``obs = (writer, i, episode)`` and ``step = i`` for the
``i``-th step of a writer, one item per step (a sequence of ``SPAN`` steps once the
episode has that many), so every item can be checked: its steps are consecutive steps of
one writer's one episode, and no (writer, step) anchors two items of a table.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

CTX = mp.get_context("spawn")
START_TIMEOUT_S = 30.0
SPAN = 3  # steps per item
EPISODE = 25  # steps per episode
SIGNATURE = {"obs": {"shape": [3], "dtype": "float32"}, "step": "int64"}


def config(max_size: int = 100_000) -> dict:
    """One table of sequences of ``SPAN`` steps, uniform, never evicting in a test."""
    return {
        "table": [
            {
                "name": "seq",
                "signature": SIGNATURE,
                "max_size": max_size,
                "layout": {"type": "sequence", "length": SPAN},
                "seed": 3,
            }
        ]
    }


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


@contextlib.contextmanager
def server_process(cfg: dict, port: int, **kwargs: Any) -> Iterator[tuple[Any, str, str | None]]:
    proc, address, restored = start_server(cfg, port, **kwargs)
    try:
        yield proc, address, restored
    finally:
        kill(proc)


# ------------------------------------------------------------------ client processes
def step(writer: int, i: int) -> dict[str, np.ndarray]:
    return {"obs": np.array([writer, i, i // EPISODE], np.float32), "step": np.int64(i)}


TYPED = ("ServerUnavailableError", "ServerRestartedError", "ReplayTimeoutError",
         "RateLimiterTimeoutError")  # fmt: skip


def write_steps(
    address: str,
    writer: int,
    steps: int,
    out: Any,
    budget_s: float,
    stop: Any = None,
    pace_s: float = 0.0,
) -> None:
    """Child: append ``steps`` steps (one sequence item per step once an episode has
    ``SPAN``), retrying any call the server did not take (a call that raised took
    nothing), then flush; or until ``stop`` is set. Reports ``(time.time(), items
    acknowledged)`` after every change, the errors seen by type, the longest failing
    call and how many chunks the server refused. Sleeps ``pace_s`` after each step."""
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
            if not attempt(lambda i=i: w.append(step(writer, i))):
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
            w.close()
        out.put(("ok", writer, acks, errors, slowest_failure, refused))
    except Exception as exc:
        out.put(("error", writer, f"{type(exc).__name__}: {exc}", errors, slowest_failure, 0))
    finally:
        client.close()


def sample_until(address: str, stop: Any, out: Any, budget_s: float) -> None:
    """Child: sample until ``stop`` is set; checks every item (consecutive steps of one
    writer's episode); reports samples, bad items, errors by type and the longest
    failing call."""
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
        out.put(("ok", sampled, bad, errors, slowest_failure))
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}", 0, errors, slowest_failure))
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


def check_checkpoint(
    path: str, acks: dict[int, list[tuple[float, int]]], before: float | None = None
) -> dict[str, Any]:
    """Restore the checkpoint at ``path`` (a directory of checkpoints: the newest valid
    one) and check it: every item consistent, no (writer, step) anchoring two items, and
    every item a writer saw acknowledged before the checkpoint's moment (and before
    ``before``, a ``time.time()``, when given) present.

    Returns:
        ``items``, ``bad`` (inconsistent items), ``duplicates``, ``missing`` (acknowledged
        before the moment but absent), ``acked_before`` and the checkpoint's ``path``.
    """
    from rlreplay.checkpoint import restore
    from rlreplay.checkpoint.restore import load
    from rlreplay.checkpoint.table_contents import read_items, step_range

    loaded = load(Path(path), False, None, False)
    moment = loaded.manifest["created_unix"]
    if before is not None:
        moment = min(moment, before)
    table = restore(loaded.directory)["seq"]
    records = read_items(table, step_range(table.store, None, None), with_data=True)
    obs, steps = records.data["obs"], records.data["step"]
    bad = int((~items_consistent(obs, steps)).sum()) if len(obs) else 0
    anchors = obs[:, 0, :2].astype(np.int64) if len(obs) else np.zeros((0, 2), np.int64)
    pairs = anchors[:, 0] * (1 << 32) + anchors[:, 1]
    duplicates = len(pairs) - len(np.unique(pairs))
    missing = acked_before = 0
    for writer, log in acks.items():
        acked = max((n for t, n in log if t < moment), default=0)
        acked_before += acked
        want = _item_anchors(acked)
        have = set(anchors[anchors[:, 0] == writer, 1].tolist())
        missing += sum(1 for a in want if a not in have)
    return {
        "path": str(loaded.directory),
        "items": len(pairs),
        "bad": bad,
        "duplicates": int(duplicates),
        "missing": missing,
        "acked_before": acked_before,
    }


def _item_anchors(n: int) -> list[int]:
    """Anchor steps of a writer's first ``n`` items (one per step from ``SPAN - 1`` steps
    into each episode, anchored ``SPAN - 1`` steps back)."""
    per_episode = EPISODE - SPAN + 1
    return [(j // per_episode) * EPISODE + j % per_episode for j in range(n)]
