"""Processes of the checkpoint and restart tests (importable by spawned children).

The server process, the writer and sampler loops and the checks of a checkpoint are the
crash benchmark's (:mod:`benchmarks.crash_trials`): steps carry who wrote them
(``obs = (writer, i, episode)``, ``step = i``), one sequence item of ``SPAN`` steps per
step, so every item can be checked and no (writer, step) may anchor two items.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.crash_trials import (  # noqa: E402
    CTX,
    EPISODE,
    SIGNATURE,
    SPAN,
    TYPED,
    check_checkpoint,
    config,
    items_consistent,
    kill,
    sample_loop,
    start_server,
    step,
    write_loop,
)

__all__ = [
    "CTX",
    "EPISODE",
    "SIGNATURE",
    "SPAN",
    "TYPED",
    "check_checkpoint",
    "config",
    "items_consistent",
    "kill",
    "sample_until",
    "server_process",
    "start_server",
    "step",
    "write_steps",
]


@contextlib.contextmanager
def server_process(cfg: dict, port: int, **kwargs: Any) -> Iterator[tuple[Any, str, str | None]]:
    """A server process on ``port`` (see :func:`start_server`), killed at the end."""
    proc, address, restored = start_server(cfg, port, **kwargs)
    try:
        yield proc, address, restored
    finally:
        kill(proc)


def write_steps(
    address: str,
    writer: int,
    steps: int,
    out: Any,
    budget_s: float,
    stop: Any = None,
    pace_s: float = 0.0,
) -> None:
    """Child: :func:`~benchmarks.crash_trials.write_loop`, its result put on ``out``."""
    out.put(write_loop(address, writer, steps, budget_s, stop, pace_s))


def sample_until(address: str, stop: Any, out: Any, budget_s: float) -> None:
    """Child: :func:`~benchmarks.crash_trials.sample_loop`, its result put on ``out``."""
    out.put(sample_loop(address, stop, budget_s))
