"""A stop request shared with child processes that no process can wedge by dying.

A process killed inside a ``multiprocessing.Event`` call can leave its lock held; a
:class:`StopFlag` is one shared byte. Invariant: no method takes a lock shared with
another process.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import time
from typing import Any

POLL_S = 0.01  # how often wait() looks at the flag


class StopFlag:
    """A flag one process sets and others poll, safe against processes killed at any moment;
    pass it to a child as a ``Process`` argument (not through a queue)."""

    def __init__(self, ctx: Any = None):
        ctx = ctx if ctx is not None else mp.get_context()
        self._flag = ctx.RawValue(ctypes.c_bool, False)

    def set(self) -> None:
        """Ask everyone polling this flag to stop (never blocks)."""
        self._flag.value = True

    def is_set(self) -> bool:
        """Whether :meth:`set` was called in any process (never blocks)."""
        return bool(self._flag.value)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until set or ``timeout`` seconds pass (None: no limit); returns whether set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._flag.value:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(POLL_S, left))
            else:
                time.sleep(POLL_S)
        return True
