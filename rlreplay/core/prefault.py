"""Mapping a new store's large columns ahead of its first fill, on another core.

A step store's columns are ``np.zeros`` arrays: construction is instant and memory is
committed as it is written, but the first write to each page makes the kernel zero it
(about 0.5 s per 5.6 GB here), on the writer's core. During a store's first pass (before
its ring wraps; after that every page is mapped) a :class:`ColumnPrefaulter` has one
background thread per process map the pages of the columns a bounded distance ahead of
the write head with ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14 and later), so the
zeroing runs on another core while the writer copies rows.

What it never does:

- change data: populating a page maps it (zeroed if it was not mapped) and leaves a
  mapped page as it is, so a writer overtaking the thread is safe;
- commit much ahead of use: at most ``LOOKAHEAD_BYTES`` past the write head (a store that
  is never filled commits nothing at construction and little after its first write);
- hold a table call: it observes the store's writes (see :meth:`StepStore.observe
  <rlreplay.core.storage.StepStore.observe>`), and a write pays one integer compare
  (``first >= its wake row``); once in every half look-ahead it tells the thread (a
  lock held for microseconds; a thread start when none runs); the thread takes no
  store lock;
- outlive its use: the thread ends when no store has pages to map now, and a later
  write starts it again; it holds prefaulters by weak reference and stores not at all,
  and stops at interpreter exit. Stores whose columns were given (a checkpoint's mapped
  files) or replaced by ``load_state`` are not prefaulted.

Where ``madvise`` or ``MADV_POPULATE_WRITE`` is missing or fails, or the process may run
on one CPU only (its affinity, or a cgroup CPU quota of one CPU or less), nothing is
done: the writer maps the pages itself, as without this module. ``RLREPLAY_PREFAULT=0``
turns it off for stores made afterwards.
"""

from __future__ import annotations

import atexit
import ctypes
import mmap
import os
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.core.cpus import cpus
from rlreplay.errors import InvalidArgumentError

if TYPE_CHECKING:
    from rlreplay.core.storage import StepStore

VARIABLE = "RLREPLAY_PREFAULT"
MADV_POPULATE_WRITE = 23  # linux/mman.h, since Linux 5.14
MIN_COLUMN_BYTES = 64 << 20  # smaller columns are not prefaulted (their faults are cheap)
LOOKAHEAD_BYTES = 256 << 20  # the most bytes mapped past the write head, over all columns
STEP_BYTES = 64 << 20  # bytes mapped per madvise round (the thread takes the GIL between)
NEVER = 1 << 62  # a wake row no write reaches: writes do not call on the thread
_PAGE = mmap.PAGESIZE  # madvise takes page-aligned addresses (4 KiB or 64 KiB pages)


def _load_madvise() -> Any:
    """libc's ``madvise`` through ctypes (which releases the GIL during the call), or
    ``None`` off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        # the process's own symbols, libc's among them (find_library would run ldconfig)
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_madvise = _load_madvise()


def enabled() -> bool:
    """Whether stores made now prefault their large columns: ``madvise`` is there and
    ``RLREPLAY_PREFAULT`` is unset, empty or ``1`` (``0`` turns it off).

    Raises:
        InvalidArgumentError: if ``RLREPLAY_PREFAULT`` is set to anything else.
    """
    text = os.environ.get(VARIABLE, "")
    if text not in ("", "0", "1"):
        raise InvalidArgumentError(
            f"{VARIABLE}={text!r} must be 0 (no pre-faulting of new stores' columns) or 1 "
            "(the default): unset it or give one of those"
        )
    return text != "0" and _madvise is not None


class ColumnPrefaulter:
    """The pages of one store's large columns, mapped ahead of its write head during its
    first pass by the process's prefault thread. Made by the store (see
    :func:`for_store`); the store holds it, it holds the store by weak reference.

    Attributes:
        mapped_rows: rows ``[0, mapped_rows)`` of every large column are mapped (written
            or populated) as far as this prefaulter knows.
        wake: the first id of a write that tells the thread to map further
            (:data:`NEVER` while the thread maps or once it is done).
        done: it has nothing more to do (first pass over, store gone, stopped, or
            ``madvise`` failed).
    """

    def __init__(self, store: StepStore, columns: list[np.ndarray]):
        self._store = weakref.ref(store)
        self.columns = columns  # held while the thread may map them (their memory stays)
        self.capacity = store.capacity
        row_bytes = sum(c.nbytes // c.shape[0] for c in columns)
        self.lookahead_rows = max(1, LOOKAHEAD_BYTES // row_bytes)
        self.step_rows = max(1, min(self.lookahead_rows, STEP_BYTES // row_bytes))
        self.mapped_rows = 0
        self.wake = 0  # the first write tells the thread
        self.done = False
        self.error = 0  # errno of a failed madvise (then done)

    def before_write(self, first: int, n: int) -> None:
        """Called by the store, with its lock held, before it writes ``n`` steps from id
        ``first``: when the write reaches the wake row, start mapping ahead (the thread is
        started when none runs)."""
        if first >= self.wake:
            self.wake = NEVER
            _worker.submit(self)

    def before_reset(self) -> None:
        """Nothing: a reset keeps the columns (and their mapped pages)."""

    def stop(self) -> None:
        """Map nothing more (the store's columns are being replaced; the store stops
        telling this prefaulter of its writes). Taken under the thread's lock, which
        :meth:`next_rows` holds while it reads ``done`` and sets the wake row."""
        with _worker.lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        """:meth:`stop` with the thread's lock held."""
        self.done = True
        self.wake = NEVER

    def rearm(self) -> None:
        """Have the store's next write wake the thread (unless done)."""
        if not self.done:
            self.wake = 0

    def next_rows(self) -> tuple[int, int] | None:
        """The rows to map next, or ``None`` when there are none now: then the wake row
        is set (where a write tells the thread again) or, at the end of the
        first pass, this prefaulter is done. Called by the thread, with its lock held;
        reads the store's head without the store's lock (a stale head only delays)."""
        store = self._store()
        if store is None or self.done:
            self.done = True
            return None
        while True:
            head = store.next_id
            if head >= self.capacity or self.mapped_rows >= self.capacity:
                self._stop_locked()  # every row has been written or mapped once
                return None
            start = max(self.mapped_rows, head)
            goal = min(self.capacity, head + self.lookahead_rows)
            if start < goal:
                self.wake = NEVER
                return start, min(goal, start + self.step_rows)
            wake = max(head + 1, self.mapped_rows - self.lookahead_rows // 2)
            self.wake = wake
            if store.next_id < wake:  # else a write got there meanwhile: go on
                return None

    def populate(self, start: int, end: int) -> None:
        """Map rows ``[start, end)`` of every large column (the GIL is released during
        each ``madvise``; the columns' memory is held by this object)."""
        for col in self.columns:
            if self.done:
                return
            row = col.nbytes // col.shape[0]
            base = col.ctypes.data
            lo = (base + start * row) & ~(_PAGE - 1)
            hi = min(base + end * row, base + col.nbytes)
            if _madvise(lo, hi - lo, MADV_POPULATE_WRITE) != 0:
                self.error = ctypes.get_errno()
                self.stop()  # unsupported (EINVAL) or refused: the writer maps its pages
                return
        self.mapped_rows = max(self.mapped_rows, end)


def for_store(store: StepStore) -> ColumnPrefaulter | None:
    """A prefaulter for a store whose columns it made itself, with prefaulting
    :func:`enabled` (the store checks that before it makes its columns), over the columns
    of at least ``MIN_COLUMN_BYTES``; ``None`` when there are none or the process may run
    on one CPU only (no other core to zero pages on)."""
    large = [c for c in store.columns.values() if c.nbytes >= MIN_COLUMN_BYTES]
    if not large or cpus() < 2:  # the CPU count (files of the cgroup) only when needed
        return None
    return ColumnPrefaulter(store, large)


class _Worker:
    """The process's prefault thread and the prefaulters with pages to map. The thread
    runs while one has rows to map now and ends otherwise; :meth:`submit` starts it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: list[weakref.ref[ColumnPrefaulter]] = []
        self.thread: threading.Thread | None = None
        self.closed = False

    def submit(self, prefaulter: ColumnPrefaulter) -> None:
        with self.lock:
            if self.closed:
                return
            if not any(ref() is prefaulter for ref in self.queue):
                self.queue.append(weakref.ref(prefaulter))
            if self.thread is None:
                thread = threading.Thread(target=self._run, name="rlreplay-prefault", daemon=True)
                try:
                    thread.start()
                except RuntimeError:
                    # No thread to be had (the process's thread limit; Python 3.12+ at
                    # interpreter shutdown): the stores map their own pages, and the
                    # write that called this goes on. A thread that never started must
                    # not be taken for a running one (no later submit would start one).
                    for ref in self.queue:
                        queued = ref()
                        if queued is not None:
                            queued._stop_locked()
                    self.queue.clear()
                    return
                self.thread = thread

    def _next_job(self) -> tuple[ColumnPrefaulter, int, int] | None:
        """The next prefaulter (round robin) and rows to map; ``None`` ends the thread
        (lock held, so a submit after it starts a new one)."""
        while self.queue and not self.closed:
            ref = self.queue.pop(0)
            pf = ref()
            if pf is None:
                continue
            rows = pf.next_rows()
            if rows is not None:
                self.queue.append(ref)
                return pf, *rows
        self.thread = None
        return None

    def _run(self) -> None:
        while True:
            with self.lock:
                job = self._next_job()
            if job is None:
                return
            pf, start, end = job
            pf.populate(start, end)
            del pf, job

    def running(self) -> threading.Thread | None:
        """The thread while it runs (for tests and diagnostics)."""
        with self.lock:
            return self.thread

    def close(self, timeout: float = 1.0) -> None:
        """Stop mapping (at interpreter exit): the thread ends after its current call."""
        with self.lock:
            self.closed = True
            self.queue.clear()
            thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def after_fork(self) -> None:
        """In a forked child: no thread runs; the stores of the prefaulters that were
        queued call on them again at their next write."""
        queued = [pf for pf in (ref() for ref in self.queue) if pf is not None]
        self.lock = threading.Lock()
        self.queue = []
        self.thread = None
        for pf in queued:
            pf.rearm()


_worker = _Worker()
atexit.register(_worker.close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_worker.after_fork)


def running_thread() -> threading.Thread | None:
    """The prefault thread while it runs, else ``None``."""
    return _worker.running()
