"""The server process of the step-wise capture tests (importable by spawned children).

It serves two tables over two stores: ``prio``, a ``Prioritized(0.6)`` table of one-row
items pre-filled with ``items`` rows (``i`` = 0, 1, ...), and ``seq``, the crash trials'
table of sequences written by remote writers (see :mod:`benchmarks.crash_trials`). The
checkpoint capture is set to copy every index in slices of ``slice_bytes``, so that a
small index is still captured in many steps.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PRIO_ALPHA = 0.6


def prio_priority(i: Any) -> Any:
    """The priority row ``i`` of ``prio`` is inserted with (positive, distinct)."""
    return 0.5 + (i % 97) / 10.0


def serve_sliced(items: int, directory: str, slice_bytes: int, out: Any, stop: Any) -> None:
    """Child: serve ``prio`` and ``seq`` with checkpoints in ``directory``; put
    ``("ok", address)`` on ``out``, then, once ``stop`` is set (or after 120 s), the
    server's checkpoint figures and stop."""
    import numpy as np

    from benchmarks.crash_trials import config
    from rlreplay import Prioritized, Table
    from rlreplay.checkpoint import snapshot
    from rlreplay.net import Server, tables_from_config

    snapshot.SLICED_ABOVE_BYTES = 0  # every index in slices
    snapshot.SLICE_BYTES = slice_bytes
    prio = Table(
        "prio",
        signature={"i": "int64"},
        max_size=items + 200_000,  # never evicts within a test
        sampler=Prioritized(PRIO_ALPHA),
        seed=0,
    )
    ids = np.arange(items, dtype=np.int64)
    prio.insert({"i": ids}, prio_priority(ids).astype(np.float64))
    try:
        server = Server(
            [prio, *tables_from_config(config())], checkpoint_dir=directory
        ).start()
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
        return
    out.put(("ok", server.address))
    deadline = time.monotonic() + 120.0
    while not stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.02)
    c = server.checkpoints
    out.put(
        {
            "capture_steps": c.capture_steps,
            "longest_capture_s": c.longest_capture_s,
            "capture_began_unix": c.capture_began_unix,
            "saved": c.saved,
            "failures": c.failures,
        }
    )
    server.stop()
