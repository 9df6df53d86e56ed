"""Replay shards in their own processes for the sharded-client tests (importable by
spawned children)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlreplay.runtime.stop_flag import StopFlag

# The network tests' server process (spawned children get this path too).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "net"))
from netprocs import serve, wait_until_stopped  # noqa: F401  (re-exported for the shard tests)

CTX = mp.get_context("spawn")
START_TIMEOUT_S = 60.0
ROWS = {"x": "int64", "obs": {"shape": [2], "dtype": "float32"}}


def table(name: str, **entry: Any) -> dict:
    """A [[table]] entry over ``ROWS`` (max_size 1000 unless given)."""
    return {"name": name, "signature": ROWS, "max_size": 1000, "capacity": 1000, **entry}


@contextlib.contextmanager
def shards(
    configs: list[dict], options: list[dict] | None = None
) -> Iterator[list[tuple[str, Any]]]:
    """One server process per config (started together, with the ``Server`` options
    ``options[i]`` if given); yields ``[(address, process)]`` and always stops them."""
    started = []
    try:
        for i, cfg in enumerate(configs):
            out, stop = CTX.Queue(), StopFlag(CTX)
            kwargs = (options[i] if options else None) or {}
            proc = CTX.Process(target=serve, args=(cfg, out, stop, kwargs), daemon=True)
            proc.start()
            started.append((proc, out, stop))
        addresses = []
        for proc, out, _ in started:
            status, value = out.get(timeout=START_TIMEOUT_S)
            if status != "ok":
                raise RuntimeError(f"shard process failed: {value}")
            addresses.append((value, proc))
        yield addresses
    finally:
        for _, _, stop in started:
            stop.set()
        for proc, _, _ in started:
            proc.join(10.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)


def insert_through(client: Any, table: str, n: int, out: Any) -> None:
    """Child: insert ``n`` rows through a sharded client that came pickled."""
    import numpy as np

    try:
        keys = client.insert(table, {"x": np.arange(n), "obs": np.zeros((n, 2), np.float32)})
        out.put(("ok", keys.tolist()))
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
