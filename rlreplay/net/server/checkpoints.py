"""Server checkpoints: a server's tables and its writers' streams, saved while it serves.

The capture is taken a step at a time between requests; its last step (the moment) saves
tables and writer streams together, so nothing acknowledged before it is lost and no chunk
is stored twice after a restore. See docs/checkpoints.md.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlreplay.checkpoint.streaming import ColumnStream
from rlreplay.errors import (
    CheckpointError,
    CheckpointMismatchError,
    InvalidArgumentError,
    ReplayTimeoutError,
    describe,
)
from rlreplay.net.server.jobs import Job, Reply, sampler_mass

if TYPE_CHECKING:
    from rlreplay.core.table import Table
    from rlreplay.net.server.sessions import WriterSessions


log = logging.getLogger("rlreplay.net")

# Seconds of capture steps per dispatcher turn: a request waits at most this plus one step.
STEP_S = 0.001


class ServerCheckpoints:
    """A server's checkpoints, run on its dispatcher thread (but :meth:`restore`, :meth:`close`).

    Args:
        directory: where checkpoints are saved (``None``: none are).
        every_s: seconds between periodic checkpoints (``None``: only on request).
        keep: the newest checkpoints kept (``None``: all).

    Attributes:
        restored_from: the checkpoint restored at start, if any.
        saved, skipped, failures: checkpoints published, skipped unchanged, and failed.
        last_path: the newest published checkpoint.
        changed: set when a request may have changed a table; cleared at each moment.
        longest_capture_s, capture_steps: the capture's longest turn (seconds) and steps.
        capture_began_unix: ``time.time()`` when the newest capture began.
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
        """``time.monotonic()`` when the next periodic checkpoint is due (``inf``: never)."""
        return self._next_due

    @property
    def busy(self) -> bool:
        """Whether a save is being captured or streamed now."""
        return self._pending is not None and not self._pending.done()

    @property
    def capturing(self) -> bool:
        """Whether a save's capture has steps left for :meth:`tick`."""
        return self._pending is not None and self._pending.capturing

    def restore(self, tables: dict[str, Table], sessions: WriterSessions) -> Path | None:
        """Restore the newest valid checkpoint into ``tables`` (in place) and ``sessions``;
        returns its path, or ``None`` if there is none yet.

        Raises:
            InvalidArgumentError: if the directory cannot be created or written.
            CheckpointError: if none is valid or the newest holds other tables or
                definitions; nothing is restored then.
        """
        if not self.enabled:
            return None
        check_writable(self.directory)
        self._next_due = self._due_from(time.monotonic())
        path = restore_served(self.directory, tables, sessions)
        if path is not None:
            self.restored_from = path
        return path

    def _due_from(self, now: float) -> float:
        return math.inf if self.every_s is None else now + self.every_s

    def tick(self, tables: dict[str, Table], sessions: WriterSessions, now: float) -> None:
        """Start a periodic checkpoint if due, or take the steps of one under way."""
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
        """Start a checkpoint (always written, changed or not); returns the pending save.

        Raises:
            InvalidArgumentError: if the server has no checkpoint directory.
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
        """Take capture steps for up to ``STEP_S`` seconds; failures are counted."""
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
            # failed before its moment: nothing published; the pending save keeps the error
            self._pending = None
            self.failures += 1
            self.changed = True
            try:
                pending.result(0)
            except Exception as exc:
                log.error("checkpoint failed before its moment: %s", exc)

    def settle(self) -> None:
        """Account for the previous save once it is done (saved or failed)."""
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
        """A client's ``checkpoint`` request: a job answered once it is published."""
        if not self.enabled:
            self.start(tables, sessions)  # raises, naming the missing directory
        return CheckpointJob(self, deadline, tables, sessions)


def check_options(
    directory: Any, every_s: Any, keep: Any
) -> tuple[Path | None, float | None, int | None]:
    """Validate a server's checkpoint options; returns ``(directory, every_s, keep)``.

    Raises:
        InvalidArgumentError: for a bad directory, period or ``keep``, or a period or
            ``keep`` without a directory.
    """
    if directory is None:
        if every_s is not None or keep is not None:
            raise InvalidArgumentError(
                "checkpoint_every_s and keep_checkpoints need checkpoint_dir= (the directory "
                "the server saves its checkpoints to)"
            )
        return None, None, None
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise InvalidArgumentError(
            f"checkpoint_dir={describe(directory)} must be a directory path (str or PathLike)"
        )
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise InvalidArgumentError(
            f"checkpoint_dir={str(root)!r} is a file; give a directory to hold checkpoints"
        )
    if every_s is not None and (
        not isinstance(every_s, (int, float))
        or isinstance(every_s, bool)
        or not math.isfinite(every_s)
        or every_s <= 0
    ):
        raise InvalidArgumentError(
            f"checkpoint_every_s={describe(every_s)} must be a number of seconds > 0, or None "
            "to checkpoint only when a client asks"
        )
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise InvalidArgumentError(
            f"keep_checkpoints={describe(keep)} must be an int >= 1 (the newest checkpoints "
            "kept), or None to keep them all"
        )
    return root, None if every_s is None else float(every_s), keep


def check_writable(directory: Path) -> None:
    """Create ``directory`` if needed and check this process may write there.

    Raises:
        InvalidArgumentError: naming the directory and the operating system's reason.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(
            f"checkpoint_dir={str(directory)!r} cannot be created ({exc.strerror}); "
            "give a directory this process can create or write"
        ) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidArgumentError(
            f"checkpoint_dir={str(directory)!r} is not writable by this process; "
            "give a directory it can write"
        )


def stores_busy(tables: dict[str, Table]) -> bool:
    """Whether a save streams one of the tables' stores or copies an index now."""
    return any(
        t.index.changes.tracking or any(isinstance(o, ColumnStream) for o in t.store.observers)
        for t in tables.values()
    )


def fingerprint(tables: dict[str, Table], sessions: WriterSessions) -> tuple:
    """Counters that change whenever anything a checkpoint saves changes."""
    parts: list[Any] = [len(sessions), sessions.dropped]
    for name in sorted(tables):
        t = tables[name]
        with t.mutex:
            lim, index = t.rate_limiter, t.index
            parts.append(
                (
                    name,
                    lim.inserts,
                    lim.samples,
                    index.size,
                    tuple(sorted(index.counts.items())),
                    t.store.next_id,
                    sampler_mass(t),
                )
            )
    return tuple(parts)


class CheckpointTaker(Protocol):
    """What a request needs of :class:`~rlreplay.net.server.checkpoints.ServerCheckpoints`."""

    directory: Path | None

    @property
    def busy(self) -> bool:
        """Whether a save is being captured or streamed now."""

    def settle(self) -> None:
        """Account for the previous save once it is done."""

    def start(self, tables: dict[str, Table], sessions: WriterSessions) -> Any:
        """Start a checkpoint; returns its pending save."""


class CheckpointJob(Job):
    """A ``checkpoint`` request, parked until its checkpoint is published.

    Answered with ``{"path": ...}``, or :class:`~rlreplay.errors.ReplayTimeoutError` past its
    deadline (the checkpoint is still written).
    """

    what = "checkpoint"
    counter = None  # no rate limiter's blocked time

    def __init__(
        self,
        owner: CheckpointTaker,
        deadline: float | None,
        tables: dict[str, Table],
        sessions: WriterSessions,
    ):
        super().__init__(None, deadline)  # type: ignore[arg-type]
        self.owner, self.tables, self.sessions = owner, tables, sessions
        self.save: Any = None

    def attempt(self) -> Reply | None:
        owner = self.owner
        if self.save is None:
            if owner.busy or stores_busy(self.tables):
                return None  # another save streams these stores now: take ours after it
            owner.settle()
            try:
                self.save = owner.start(self.tables, self.sessions)
            except CheckpointError:
                if stores_busy(self.tables):
                    return None  # an in-process save of these stores began meanwhile
                raise
        if not self.save.done():
            return None
        owner.settle()
        try:
            path = self.save.result(0)
        except CheckpointError:
            if not self.save.steps.moment_taken and stores_busy(self.tables):
                self.save = None  # an in-process save took these stores first: ours after it
                return None
            raise
        except InvalidArgumentError:
            raise
        except Exception as exc:  # e.g. the disk is full: answered as a CheckpointError
            where = f" into {str(owner.directory)!r}" if owner.directory is not None else ""
            raise CheckpointError(
                f"the checkpoint could not be written{where}: {exc!r}; nothing was published "
                "(the server goes on serving; free the disk or fix the directory, then ask again)"
            ) from exc
        return {"path": str(path)}, None

    def timeout_error(self, waited: float) -> ReplayTimeoutError:
        return ReplayTimeoutError(
            f"the checkpoint was not published within {waited:.3g}s (it goes on being "
            "written; give checkpoint() a longer timeout)"
        )


log = logging.getLogger("rlreplay.net")

SERVER_STATE = "server"  # the manifest's extra section holding the writers' streams


def writer_streams_section(sessions: WriterSessions) -> dict[str, Any]:
    """The manifest's extra section: each writer stream's state, least recently used first."""
    states = sessions.state()
    return {SERVER_STATE: {"writers": {str(i): state for i, state in enumerate(states)}}}


def restore_served(
    directory: Path, tables: dict[str, Table], sessions: WriterSessions
) -> Path | None:
    """Restore the newest valid checkpoint in ``directory`` into ``tables`` and its writer
    streams into ``sessions``; returns its path, or ``None`` if there is none yet.

    Raises:
        CheckpointError: if none is valid or the newest holds other tables or
            definitions; nothing is restored then.
    """
    from rlreplay.checkpoint import list_checkpoints
    from rlreplay.checkpoint.restore import restore_with_extra

    if not list_checkpoints(directory):
        return None
    try:
        path, _, extra = restore_with_extra(directory, list(tables.values()))
    except CheckpointMismatchError as exc:
        raise CheckpointMismatchError(
            f"{exc}. A server restores into the tables it serves and takes no adapt=: "
            "serve the definitions the checkpoint was saved with, or give another "
            f"checkpoint directory than {str(directory)!r}; to change a "
            "definition, restore the checkpoint in Python with "
            "rlreplay.checkpoint.restore(path, tables, adapt=True) into tables built as "
            "now and save them with rlreplay.checkpoint.save into the new directory"
        ) from None
    saved = (extra or {}).get(SERVER_STATE, {}).get("writers", {})
    states = [saved[k] for k in sorted(saved, key=int)]  # least recently used first
    usable = [s for s in states if all(n in tables for n in s["tables"])]
    if len(usable) < len(states):
        log.warning(
            "%d writer stream(s) in %s name tables this server does not serve; their "
            "writers start afresh",
            len(states) - len(usable),
            path,
        )
    sessions.load_state(usable, tables, time.monotonic())
    log.info("restored %s (%d writer streams)", path, len(usable))
    return path
