"""A stop request shared with child processes that no process can wedge by dying.

``multiprocessing.Event`` guards its flag with a lock shared between processes and counts
the processes sleeping in ``wait()``. A process killed (``kill -9``, the OOM killer) while
inside ``is_set()``, ``set()`` or ``wait()`` leaves that lock held or a sleeper counted
forever, and from then on every ``set()`` in every process blocks without end: the driver
that stops its actors after one of them was killed would hang.

:class:`StopFlag` is one shared byte and nothing else. Setting it is one store and reading
it one load, so a process killed at any instruction leaves nothing half done; ``wait``
polls. Invariant: no method takes a lock shared with another process.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import time
from typing import Any

POLL_S = 0.01  # how often wait() looks at the flag


class StopFlag:
    """A flag that one process sets and others poll, safe against processes killed at
    any moment. Pass it to a child process as a ``Process`` argument (like any shared
    ``multiprocessing`` value, it cannot travel through a queue)."""

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
        """Wait until the flag is set or ``timeout`` seconds pass (None: no limit); returns
        whether it is set."""
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
