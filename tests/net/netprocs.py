"""Process targets and helpers for the network tests (importable by spawned children)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from rlreplay.runtime.stop_flag import StopFlag

CTX = mp.get_context("spawn")
START_TIMEOUT_S = 30.0

STEP_SIGNATURE = {"obs": {"shape": [3], "dtype": "float32"}, "step": "int64"}


def config(*tables: dict, stores: tuple = ()) -> dict:
    """A tables.toml-shaped mapping."""
    return {"store": list(stores), "table": list(tables)}


def serve(cfg: dict, out: Any, stop: Any, kwargs: dict) -> None:
    """Child process: serve ``cfg`` until ``stop`` is set (or SIGTERM)."""
    from rlreplay.net import Server, tables_from_config

    try:
        server = Server(tables_from_config(cfg), **kwargs).start()
    except Exception as exc:  # reported to the parent, which fails the test
        out.put(("error", f"{type(exc).__name__}: {exc}"))
        return
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    out.put(("ok", server.address))
    stop.wait(300.0)  # a StopFlag: this process may be killed while it waits
    server.stop()


@contextlib.contextmanager
def served(cfg: dict, **kwargs: Any) -> Iterator[tuple[str, Any]]:
    """Run a server in its own process; yields ``(address, process)`` and always stops it."""
    out, stop = CTX.Queue(), StopFlag(CTX)
    proc = CTX.Process(target=serve, args=(cfg, out, stop, kwargs), daemon=True)
    proc.start()
    try:
        status, value = out.get(timeout=START_TIMEOUT_S)
        if status != "ok":
            raise RuntimeError(f"server process failed: {value}")
        yield value, proc
    finally:
        stop.set()
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)


def step(i: int, writer: int = 0) -> dict[str, np.ndarray]:
    """Step ``i`` of ``writer``: obs = (writer, i, i) so items can be checked."""
    return {"obs": np.array([writer, i, i], np.float32), "step": np.int64(i)}


def run_writer(address: str, table: str, writer: int, steps: int, episode: int, out: Any):
    """Child: append ``steps`` steps in episodes, one item per step, then report keys."""
    from rlreplay.net import Client

    try:
        client = Client(address)
        with client.trajectory_writer(table, chunk_steps=64, keep_keys=True) as w:
            span = client.describe(table)["span"]
            for i in range(steps):
                w.append(step(i, writer))
                if (i % episode) + 1 >= span:
                    w.create_item(table, priority=1.0)
                if (i + 1) % episode == 0:
                    w.end_episode()
            w.flush(timeout=60.0)
            keys = np.concatenate(w.keys) if w.keys else np.zeros(0, np.int64)
        out.put(("ok", writer, keys.tolist()))
    except Exception as exc:
        out.put(("error", writer, f"{type(exc).__name__}: {exc}"))


def run_sampler(address: str, table: str, stop: Any, out: Any, batch: int) -> None:
    """Child: sample until ``stop``; checks every item's data; reports counts."""
    from rlreplay.errors import RateLimiterTimeoutError
    from rlreplay.net import Client

    try:
        client = Client(address)
        sampled = bad = 0
        deadline = time.monotonic() + 120.0
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                s = client.sample(table, batch, timeout=0.2)
            except RateLimiterTimeoutError:
                continue
            obs, nxt = s.data["obs"], s.data["next_obs"]
            ok = (nxt[:, 0] == obs[:, 0]) & (nxt[:, 1] == obs[:, 1] + 1)
            ok &= s.data["step"] == obs[:, 1].astype(np.int64)
            bad += int((~ok).sum())
            sampled += len(s)
        out.put(("ok", os.getpid(), sampled, bad))
    except Exception as exc:
        out.put(("error", os.getpid(), f"{type(exc).__name__}: {exc}", 0))


def insert_rows(client: Any, table: str, n: int) -> Any:
    """Child helper target: insert ``n`` rows through a client that came pickled."""
    rows = {"obs": np.ones((n, 3), np.float32), "step": np.arange(n)}
    return client.insert(table, rows)


def pickled_client_inserts(client: Any, table: str, n: int, out: Any) -> None:
    try:
        out.put(("ok", insert_rows(client, table, n).tolist()))
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def blocked_sample(address: str, table: str, timeout: float, out: Any) -> None:
    """Child: one sample that the parent unblocks by inserting; reports the outcome."""
    from rlreplay.net import Client

    start = time.monotonic()
    try:
        s = Client(address).sample(table, 2, timeout=timeout)
        out.put(("ok", len(s), time.monotonic() - start))
    except Exception as exc:
        out.put((type(exc).__name__, str(exc), time.monotonic() - start))


def serve_logging(cfg: dict, out: Any, stop: Any, kwargs: dict, log_path: str) -> None:
    """Child process: :func:`serve`, with the server's log (level INFO) written to
    ``log_path`` as the ``rlreplay serve`` command writes it to stderr."""
    import logging

    logging.basicConfig(filename=log_path, level=logging.INFO, format="%(levelname)s %(message)s")
    serve(cfg, out, stop, kwargs)


def wait_until_stopped(pid: int, limit_s: float = 10.0) -> None:
    """Wait until every thread of process ``pid`` is stopped (``kill`` only queues the
    signal: a busy machine may let the server answer one more request first)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(state in "tT" for state in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop within {limit_s}s")


def parked_queue_sample(address: str, table: str, out: Any) -> None:
    """Child: a learner's ``sample(table, 1)`` without a timeout (parked until an item
    comes); reports that it is connected, then what it drew (if it lives that long)."""
    from rlreplay.net import Client

    client = Client(address)
    client.ping()
    out.put(("connected", os.getpid()))
    batch = client.sample(table, 1)
    out.put(("sampled", batch.data["step"].tolist()))


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
