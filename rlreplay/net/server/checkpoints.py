"""Server checkpoints: a server's tables and its writers' streams, saved while it serves.

A :class:`~rlreplay.Server` given a ``checkpoint_dir`` saves every table it serves (and
the stores under them) with :mod:`rlreplay.checkpoint`, every ``checkpoint_every_s``
seconds and when a client asks (``client.checkpoint()``, ``rlreplay checkpoint
ADDRESS``), keeping the newest ``keep_checkpoints``. When it starts, it restores the
newest valid checkpoint in that directory (one that fails its checks is skipped with a
warning).

The capture. The dispatcher takes a checkpoint's capture a step at a time between
requests (:class:`~rlreplay.checkpoint.save.StepwiseSave`, the mechanism under every
save): the buffers are made in a helper thread, then a large index's per-item state is
copied a slice (:data:`~rlreplay.checkpoint.snapshot.SLICE_BYTES`) per step while the
index notes the slots that the requests served meanwhile change. A request waits for
one step (at most ``STEP_S`` of steps, then one more), never for the whole copy.

The moment. The capture's last step is the checkpoint's moment, taken on the dispatcher
thread between two requests: what changed since the slices were copied and the rest of
the per-item state of every table under its store's lock, and the state of every remote
writer's stream (:meth:`~rlreplay.net.server.sessions.WriterSessions.state`: its position, the
steps it retains, the replies kept for chunks sent again). No request runs meanwhile, so
the streams match the tables exactly: every chunk applied before the moment is in the
checkpoint with its reply, none after. The step columns are then
streamed to disk by a background thread while the dispatcher goes on serving (the store
copies aside, first, rows it overwrites before they are written, see
:mod:`rlreplay.checkpoint.streaming`); the checkpoint is published by one atomic rename.

After a restart from a checkpoint, a writer sends again every chunk it had not seen
acknowledged. A chunk applied before the moment is answered with its first reply (its
items are not created twice); the next one is applied as if nothing happened. Chunks
the stopped server applied *after* the moment were acknowledged but are lost with it:
the restored stream takes the writer's next chunk as a new episode (its items cannot
reach the lost steps; a chunk whose items do is refused and the writer drops it, as for
any refused chunk). Nothing acknowledged before the newest checkpoint's moment is lost.

Idle servers write nothing. A periodic checkpoint is skipped when nothing changed since
the last checkpoint's moment: no request that may change a table was served (inserts,
samples, which change ``times_sampled`` and the limiter's counts, priority updates,
deletes, resets, writer chunks), and no table's counters (inserts, samples, size,
deletes, evictions, the store's next step id, the sampler's total weight) nor the number
of writer streams differ from what they were then (which catches changes made in process
to a served table). A requested checkpoint (``client.checkpoint()``) is always written.

The parts. :class:`ServerCheckpoints` here schedules and takes the checkpoints; its
options are checked by :mod:`rlreplay.net.server.checkpoint_options`, what changed since the
last moment is told by :mod:`rlreplay.net.server.checkpoint_changes`, the restore at start and
the writers' section of the manifest are :mod:`rlreplay.net.server.checkpoint_restore`'s, and
a client's request, parked until its checkpoint is published, is a
:class:`~rlreplay.net.server.checkpoint_requests.CheckpointJob`.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlreplay.errors import InvalidArgumentError
from rlreplay.net.server.checkpoint_changes import fingerprint, stores_busy
from rlreplay.net.server.checkpoint_options import check_options, check_writable
from rlreplay.net.server.checkpoint_requests import CheckpointJob
from rlreplay.net.server.checkpoint_restore import restore_served, writer_streams_section
from rlreplay.net.server.jobs import Job

if TYPE_CHECKING:
    from rlreplay.core.table import Table
    from rlreplay.net.server.sessions import WriterSessions

log = logging.getLogger("rlreplay.net")

# The dispatcher takes capture steps until this many seconds are spent, then serves what
# waits: a request waits for at most this plus one step (a slice's copy, ~1 ms).
STEP_S = 0.001


class ServerCheckpoints:
    """The checkpoints of one server: periodic ones, requested ones, and the restore at
    start. Every method runs on the server's dispatcher thread, except :meth:`restore`
    (before it starts) and :meth:`close` (as it stops).

    Args:
        directory: where checkpoints are saved (``None``: the server saves none).
        every_s: seconds between periodic checkpoints (``None``: only on request).
        keep: the newest checkpoints kept (``None``: all).

    Attributes:
        restored_from: the checkpoint restored at start, if any.
        saved: checkpoints published since start; ``last_path`` the newest of them.
        skipped: periodic checkpoints not written because nothing had changed.
        changed: set by the server when it served a request that may change a table;
            cleared at each checkpoint's moment.
        failures: saves that failed (each logged).
        longest_capture_s: the longest time the capture's steps held the dispatcher at
            once, in seconds.
        capture_steps: capture steps taken (several per checkpoint of a large index).
        capture_began_unix: ``time.time()`` when the newest checkpoint's capture began
            (its moment is the manifest's ``created_unix``).
    """

    def __init__(self, directory: Any, every_s: Any = None, keep: Any = None):
        self.directory, self.every_s, self.keep = check_options(directory, every_s, keep)
        self._pending: Any = None  # the save being captured or streamed, if any
        self._next_due = math.inf
        self.restored_from: Path | None = None
        self.saved = 0
        self.skipped = 0
        self.changed = True
        self._moment: tuple | None = None  # the fingerprint of the last checkpoint's moment
        self.failures = 0
        self.last_path: Path | None = None
        self.longest_capture_s = 0.0
        self.capture_steps = 0
        self.capture_began_unix: float | None = None

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    @property
    def next_due(self) -> float:
        """``time.monotonic()`` value when the next periodic checkpoint is due (``inf``:
        none is)."""
        return self._next_due

    @property
    def busy(self) -> bool:
        """Whether a save is being captured or streamed now."""
        return self._pending is not None and not self._pending.done()

    @property
    def capturing(self) -> bool:
        """Whether a save's capture has steps left for the dispatcher (:meth:`tick`
        takes them; the dispatcher does not wait for requests meanwhile)."""
        return self._pending is not None and self._pending.capturing

    # -------------------------------------------------------------- restore
    def restore(self, tables: dict[str, Table], sessions: WriterSessions) -> Path | None:
        """Restore the newest valid checkpoint in the directory into ``tables`` (in
        place; their definitions must match the checkpoint's) and ``sessions``; returns
        its path, or ``None`` when the directory holds no checkpoint yet.

        Raises:
            InvalidArgumentError: if the directory cannot be created or written.
            CheckpointError: if checkpoints are there but none is valid, or the newest
                valid one holds other tables or definitions (the message says which and
                what to do); nothing is restored then.
        """
        if not self.enabled:
            return None
        check_writable(self.directory)
        self._next_due = self._due_from(time.monotonic())
        path = restore_served(self.directory, tables, sessions)
        if path is not None:
            self.restored_from = path
        return path

    # ----------------------------------------------------------------- saving
    def _due_from(self, now: float) -> float:
        return math.inf if self.every_s is None else now + self.every_s

    def tick(self, tables: dict[str, Table], sessions: WriterSessions, now: float) -> None:
        """Start a periodic checkpoint if one is due and none is being written (by this
        server, or by an in-process save of the same tables, which it waits for), and
        take the steps of a capture under way."""
        if self.capturing:
            self.advance(tables, sessions)
            return
        if now < self._next_due or self.busy or stores_busy(tables):
            return
        self.settle()
        self._next_due = self._due_from(now)
        if not self.changed and self._moment == fingerprint(tables, sessions):
            self.skipped += 1
            log.debug("periodic checkpoint skipped: nothing changed since the last one")
            return
        self.start(tables, sessions)  # a failure is counted and logged by advance()

    def start(self, tables: dict[str, Table], sessions: WriterSessions) -> Any:
        """Start a checkpoint: its capture's first steps are taken now, the others by
        :meth:`tick` between requests; its moment (tables and writer streams) is the
        last step, and the columns are then streamed in the background. Returns the
        pending save. Always writes, changed or not.

        Raises:
            InvalidArgumentError: if the server has no checkpoint directory (errors of
                the capture itself are kept in the pending save).
        """
        if not self.enabled:
            raise InvalidArgumentError(
                "this server saves no checkpoints: start it with checkpoint_dir= (rlreplay "
                "serve --checkpoint-dir DIR)"
            )
        from rlreplay.checkpoint.save import PendingSave, StepwiseSave

        steps = StepwiseSave(
            list(tables.values()),
            self.directory,
            keep=self.keep,
            extra=lambda: writer_streams_section(sessions),
            buffers_in_thread=True,
        )
        self.capture_began_unix = time.time()
        pending = self._pending = PendingSave(steps, capture_here=True)
        self.advance(tables, sessions)
        return pending  # a capture that failed is counted, its error kept in it

    def advance(self, tables: dict[str, Table], sessions: WriterSessions) -> None:
        """Take capture steps for up to ``STEP_S`` seconds (dispatcher thread, between
        requests). When the moment is taken, note what it holds (no request ran between
        the moment and this). A capture that fails is counted and logged here."""
        pending = self._pending
        t0 = time.perf_counter()
        while pending is not None and pending.capturing:
            pending.step()
            self.capture_steps += 1
            if time.perf_counter() - t0 >= STEP_S or pending.steps.capture.waiting:
                break
        self.longest_capture_s = max(self.longest_capture_s, time.perf_counter() - t0)
        if pending is None or pending.capturing:
            return
        if pending.steps.moment_taken:
            self._moment, self.changed = fingerprint(tables, sessions), False
        elif self._pending is pending:
            # failed before its moment: nothing was published; requests asking for this
            # checkpoint get the error from the pending save
            self._pending = None
            self.failures += 1
            self.changed = True
            try:
                pending.result(0)
            except Exception as exc:
                log.error("checkpoint failed before its moment: %s", exc)

    def settle(self) -> None:
        """Account for the previous save once it is done (counted as saved or failed);
        nothing while it is under way."""
        pending = self._pending
        if pending is None or not pending.done():
            return
        self._pending = None
        try:
            self.last_path = pending.result(0)
            self.saved += 1
        except Exception as exc:
            self.failures += 1
            self.changed = True  # nothing was published: the next periodic one is written
            log.error("checkpoint failed: %s", exc)

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a save being written (the server stops)."""
        if self._pending is not None and self._pending.capturing:
            self._pending.abandon()  # nothing of it written yet: given up, not failed
            self._pending = None
            log.info("the checkpoint being captured when the server stopped was given up")
        if self._pending is not None:
            try:
                self._pending.result(timeout)
            except Exception as exc:
                log.warning("the checkpoint under way when the server stopped: %s", exc)
            self.settle()

    def request(self, deadline: float | None, tables: dict, sessions: WriterSessions) -> Job:
        """A client's ``checkpoint`` request: a job answered with the checkpoint's path
        once it is published (a save under way is awaited first, so the new checkpoint
        holds everything acknowledged before the request)."""
        if not self.enabled:
            self.start(tables, sessions)  # raises, naming the missing directory
        return CheckpointJob(self, deadline, tables, sessions)
