"""What a benchmark's child process (a server it started) sends back to the parent."""

from __future__ import annotations

import queue
import time
from typing import Any


def reply_from(proc: Any, out: Any, timeout: float) -> Any:
    """The next object ``proc`` puts on ``out``, waiting at most ``timeout`` seconds.

    Raises ``RuntimeError`` as soon as ``proc`` has exited without sending one (a server
    that failed to start), and ``TimeoutError`` after ``timeout``: a parent never waits
    out its whole timeout on a child that is already gone.
    """
    end = time.monotonic() + timeout
    while True:
        try:
            return out.get(timeout=min(0.5, max(end - time.monotonic(), 0.01)))
        except queue.Empty:
            if not proc.is_alive():
                raise RuntimeError(
                    f"the child process {proc.pid} exited with code {proc.exitcode} before "
                    "replying; its error is printed above"
                ) from None
            if time.monotonic() >= end:
                raise TimeoutError(
                    f"no reply from child process {proc.pid} in {timeout}s"
                ) from None
