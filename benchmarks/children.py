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
                try:  # it may have replied just before it exited
                    return out.get_nowait()
                except queue.Empty:
                    pass
                code = proc.exitcode
                why = (
                    f"exited with code {code}; its error is printed above"
                    if code is not None and code > 0
                    else f"was ended by signal {-code}"
                    if code is not None and code < 0
                    else "ended"
                )
                raise RuntimeError(f"the child process {proc.pid} {why}, before replying") from None
            if time.monotonic() >= end:
                raise TimeoutError(
                    f"no reply from child process {proc.pid} in {timeout}s"
                ) from None
