"""Saving tables: capture, stream, publish atomically, keep the last K.

Files go into a temporary sibling directory, fsynced, manifest last, then one atomic
rename to ``ckpt-<sequence>``: a crash leaves the complete checkpoint or a temporary
directory restore ignores. See docs/checkpoints.md.
"""

from __future__ import annotations

import datetime
import os
import secrets
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.checkpoint import increments, retention
from rlreplay.checkpoint.manifest import (
    FORMAT,
    FORMAT_VERSION,
    flatten_state,
    write_array,
    write_manifest,
)
from rlreplay.checkpoint.progress import Progress
from rlreplay.checkpoint.snapshot import Capture, Snapshot, as_tables
from rlreplay.core.table import Table
from rlreplay.errors import CheckpointError, InvalidArgumentError, ReplayTimeoutError, describe
from rlreplay.version import __version__

_NAMING = threading.Lock()

WRITERS_NOTE = (
    "Items the writers created and steps they appended before this checkpoint's moment "
    "are saved; the writers themselves (steps retained for an episode in progress) are not: "
    "after a restore, writers start new episodes."
)


def _temporary_name(seq: int) -> str:
    return f".tmp-{retention.name_of(seq)}-{os.getpid()}-{secrets.token_hex(4)}"


def _check_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"path={describe(path)} must be a directory path (str or os.PathLike); "
            "checkpoints are written as subdirectories of it"
        )
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise InvalidArgumentError(
            f"path={str(root)!r} is a file; give a directory to hold the checkpoints"
        )
    return root


class SaveStats:
    """Figures of one save: bytes written, the longest lock holds, aside copies.

    Attributes:
        bytes: bytes this save wrote (reused files not counted).
        reused_bytes: bytes of column files linked or copied from the previous checkpoint.
        total_bytes: bytes of every file the checkpoint lists.
        capture_held_s, chunk_held_s: the longest lock holds of the state's capture and of
            one piece of the columns' copy, in seconds.
        aside_peak_bytes: the most bytes of rows copied aside at once.
        state_peak_bytes: the most bytes of per-item state held in memory at once.
        path: the published checkpoint.
    """

    def __init__(self) -> None:
        self.bytes = 0
        self.reused_bytes = 0
        self.total_bytes = 0
        self.capture_held_s = 0.0
        self.chunk_held_s = 0.0
        self.aside_peak_bytes = 0
        self.state_peak_bytes = 0
        self.path: Path | None = None
        # Set once the checkpoint's moment is taken (or the save failed before it).
        self.captured = threading.Event()


class StepwiseSave:
    """A save whose capture the caller takes one step at a time.

    The last step is the checkpoint's moment; :meth:`write` then streams the columns and
    publishes the checkpoint. ``tables``, ``path``, ``keep``, ``progress`` and ``extra`` are
    as :func:`save`'s.

    Args:
        stats: filled with the save's figures (a new :class:`SaveStats` when ``None``).
        slice_bytes: bytes one capture step copies (default ``snapshot.SLICE_BYTES``).
        buffers_in_thread: make the capture's buffers in a helper thread.

    Raises:
        InvalidArgumentError: for bad ``tables``, ``path`` or ``keep`` (nothing written).
    """

    def __init__(
        self,
        tables: Table | Sequence[Table] | Mapping[str, Table],
        path: str | os.PathLike,
        *,
        keep: int | None = None,
        progress: bool = False,
        stats: SaveStats | None = None,
        extra: Callable[[], Mapping[str, Any]] | None = None,
        slice_bytes: int | None = None,
        buffers_in_thread: bool = False,
    ):
        self.tables = as_tables(tables)
        self.root = _check_path(path)
        self.keep = retention.check_keep(keep)
        self.progress = progress
        self.stats = stats if stats is not None else SaveStats()
        self.extra = extra
        self.capture = Capture(
            self.tables,
            slice_bytes=slice_bytes,
            buffers_in_thread=buffers_in_thread,
            staging=self._staging,
        )
        self._moment: tuple[Snapshot, Path, int, Any] | None = None  # until written
        # the lock on the temporary directory while this save works in it
        self._hold: retention.DirectoryHold | None = None
        self.moment_taken = False
        self.failed = False

    @property
    def done(self) -> bool:
        """Whether the checkpoint's moment is taken (or a step failed)."""
        return self.moment_taken or self.failed

    def step(self) -> None:
        """Take the capture's next step; the last one takes the moment. A failed step abandons it.

        Raises:
            ClosedError: if a table is closed.
            CheckpointError: if another save of the same store is under way.
            OSError: if the checkpoint's temporary directory cannot be made.
        """
        if self.done:
            return
        try:
            if not self.capture.ready:
                self.capture.step()
            else:
                self._take_moment()
        except BaseException:
            self.failed = True
            self.capture.abandon()
            self._let_go()
            self.stats.captured.set()
            raise

    def _let_go(self) -> None:
        if self._hold is not None:
            self._hold.release()
            self._hold = None

    def _make_root(self) -> None:
        """Create the checkpoints' directory; raises CheckpointError when it cannot."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CheckpointError(
                f"the checkpoint could not be written into {str(self.root)!r}: "
                f"{error.strerror or error} ({type(error).__name__}); give a directory "
                "this process can create and write"
            ) from error

    def _staging(self) -> Path:
        """A temporary directory for files written before the moment, renamed at the moment;
        named as a save's temporary directory (sequence 0), so prune removes it if we die."""
        self._make_root()
        staging = self.root / _temporary_name(0)
        staging.mkdir()
        self._hold = retention.DirectoryHold(staging)  # kept through the rename to tmp
        return staging

    def _take_moment(self) -> None:
        # One lock over naming and the moment: a later sequence never holds an earlier moment.
        with _NAMING:
            self._make_root()
            seq = retention.next_sequence(self.root)
            tmp = self.root / _temporary_name(seq)
            staged = self.capture.staging_dir
            if staged is None:
                tmp.mkdir()
                self._hold = retention.DirectoryHold(tmp)
            else:
                os.rename(staged, tmp)
                self.capture.staging_dir = tmp
            try:
                snap = self.capture.moment(tmp, increments.previous_stores(self.root))
                try:
                    extra_state = None if self.extra is None else self.extra()
                except BaseException:
                    snap.release()
                    raise
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        self._moment = (snap, tmp, seq, extra_state)
        self.moment_taken = True
        self.stats.captured.set()

    def abandon(self) -> None:
        """Give up a save whose moment is not taken."""
        if not self.done:
            self.failed = True
            self.capture.abandon()
            self._let_go()
            self.stats.captured.set()

    def write(self) -> Path:
        """Stream the columns, write the manifest and publish; returns the checkpoint's directory.

        Raises:
            CheckpointError: if the moment was not taken.
            OSError: if writing fails (nothing is published).
        """
        if self._moment is None:
            raise CheckpointError("the save has no moment to write: step() it until done")
        snap, tmp, seq, extra_state = self._moment
        self._moment = None  # written once
        stats = self.stats
        try:
            try:
                manifest = _write(snap, tmp, self.progress, stats, extra_state)
            finally:
                snap.release()
            write_manifest(tmp, manifest)
            retention.fsync_dir(tmp)
            final = _publish(self.root, tmp, seq)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            self._let_go()
        with _NAMING:
            retention.prune(self.root, self.keep)
        stats.path = final
        return final


def save(
    tables: Table | Sequence[Table] | Mapping[str, Table],
    path: str | os.PathLike,
    *,
    keep: int | None = None,
    progress: bool = False,
    stats: SaveStats | None = None,
    extra: Callable[[], Mapping[str, Any]] | None = None,
) -> Path:
    """Save ``tables`` (and their stores) as a new checkpoint under ``path``.

    Tables over one store are saved as of one moment; other threads keep inserting and
    sampling meanwhile, and what they do after the moment is not saved.

    Args:
        tables: a table, or a list or dict of tables with distinct names.
        path: directory of checkpoints (created if missing); the checkpoint is its new
            subdirectory ``ckpt-<sequence>``.
        keep: keep only this many newest checkpoints under ``path`` (``None``: all).
        progress: show a progress bar (tqdm, when installed).
        stats: filled with the save's figures when given.
        extra: called right after the tables' state is taken; its result (a dict of JSON
            values and numpy arrays) is saved and returned by
            :func:`~rlreplay.checkpoint.restore.restore_with_extra`.

    Returns:
        The published checkpoint's directory.

    Raises:
        InvalidArgumentError: for bad ``tables``, ``path`` or ``keep`` (nothing written).
        ClosedError: if a table is closed.
        CheckpointError: if another save of the same store is under way.
        OSError: if writing fails (nothing is published).
    """
    steps = StepwiseSave(tables, path, keep=keep, progress=progress, stats=stats, extra=extra)
    while not steps.done:
        steps.step()
    return steps.write()


def _write(
    snap: Snapshot, tmp: Path, progress: bool, stats: SaveStats, extra: Any = None
) -> dict[str, Any]:
    """Write every array of ``snap`` and ``extra`` into ``tmp``; returns the manifest."""
    arrays: dict[str, Any] = {}
    tables = [
        {
            "name": ts.table.name,
            "store": ts.store,
            "definition": ts.definition,
            "state": flatten_state(ts.state, f"t{i}", arrays),
        }
        for i, ts in enumerate(snap.tables)
    ]
    extra_json = None if extra is None else flatten_state(extra, "x", arrays)
    files: dict[str, Any] = snap.finish()  # the per-item state written by the capture
    stats.state_peak_bytes = snap.state_peak_bytes + sum(
        a.nbytes for name, a in arrays.items() if name.startswith("t")
    )
    reused: dict[Path, dict] = {}
    for s in snap.stores:
        if s.previous is not None and s.reusable is not None and len(s.reusable):
            chunks, entries, nbytes = increments.reuse(s.previous, s.reusable, s.stream.files)
            s.stream.skip(np.asarray(chunks, np.int64))
            reused.update(entries)
            stats.reused_bytes += nbytes
    for name, arr in arrays.items():
        files[name] = write_array(tmp / name, arr)
    total = sum(s.store.nbytes for s in snap.stores) - stats.reused_bytes
    bar = Progress(progress, max(0, total), "checkpoint")
    try:
        for s in snap.stores:
            entries = {**s.stream.write(bar.update), **reused}
            for path, names in s.column_files.items():
                for name, target in zip(names, s.stream.files[path]):
                    files[name] = entries[target]
            stats.chunk_held_s = max(stats.chunk_held_s, s.stream.held_s)
            stats.aside_peak_bytes = max(stats.aside_peak_bytes, s.stream.aside_peak_bytes)
    finally:
        bar.close()
    stats.capture_held_s = snap.held_s
    stats.total_bytes = sum(f["bytes"] for f in files.values())
    stats.bytes = stats.total_bytes - stats.reused_bytes
    created = datetime.datetime.fromtimestamp(snap.created_unix, datetime.timezone.utc)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_at": created.isoformat(),
        "created_unix": snap.created_unix,
        "rlreplay_version": __version__,
        "stores": [
            {
                **s.definition,
                "state": s.state,
                "columns": s.column_files,
                "chunk_rows": s.store.chunk_rows,
                "increments": s.increments,
            }
            for s in snap.stores
        ],
        "tables": tables,
        "files": files,
        "writers": WRITERS_NOTE,
        **({} if extra_json is None else {"extra": extra_json}),
    }


def _publish(root: Path, tmp: Path, seq: int) -> Path:
    """Rename ``tmp`` to the first free ``ckpt-<sequence>`` from ``seq`` on; fsync ``root``."""
    for attempt in range(1000):
        final = root / retention.name_of(seq + attempt)
        if final.exists():
            continue
        try:
            os.rename(tmp, final)
        except OSError:
            if final.exists():  # taken meanwhile
                continue
            raise
        retention.fsync_dir(root)
        return final
    raise CheckpointError(f"no free checkpoint name under {root} after {seq}")


class PendingSave:
    """A save written in a background thread.

    Args:
        steps: the save.
        capture_here: the caller takes the capture's steps (:meth:`step`), not the thread.
    """

    def __init__(self, steps: StepwiseSave, *, capture_here: bool = False):
        self.steps = steps
        self.stats = steps.stats
        self._result: Path | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if not capture_here:
            self._start()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="rlreplay-checkpoint")
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self.steps.done:
                self.steps.step()
            self._result = self.steps.write()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc
        finally:
            self.stats.captured.set()

    @property
    def capturing(self) -> bool:
        """Whether the caller still has capture steps to take."""
        return self._thread is None and self._error is None

    def step(self) -> None:
        """Take the capture's next step; after the moment, columns are written in the background."""
        if not self.capturing:
            return
        try:
            self.steps.step()
        except Exception as exc:
            self._error = exc
            return
        if self.steps.done:
            self._start()

    def abandon(self) -> None:
        """Give up the capture if its moment is not taken (:meth:`result` then raises)."""
        if self.capturing:
            self.steps.abandon()
            self._error = CheckpointError("the checkpoint was abandoned before its moment")

    def done(self) -> bool:
        """Whether the save has finished (published or failed)."""
        if self._thread is None:
            return self._error is not None
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> Path:
        """Wait up to ``timeout`` seconds (``None``: no limit, ``0``: none); returns the directory.

        Raises:
            ReplayTimeoutError: if the save has not finished within ``timeout`` (it goes on).
            InvalidArgumentError: for a ``timeout`` that is not a number >= 0 or None.
            Exception: what the save raised.
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0
        ):
            raise InvalidArgumentError(
                f"timeout={describe(timeout)} must be a number of seconds >= 0 (0: look "
                "without waiting), or None to wait until the save ends"
            )
        if self._thread is not None:
            self._thread.join(timeout)
        if not self.done():
            raise ReplayTimeoutError(
                f"the checkpoint is still being written after timeout={timeout}s; it goes on: "
                "call result() again, with a longer timeout"
            )
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def start_save(
    tables: Table | Sequence[Table] | Mapping[str, Table],
    path: str | os.PathLike,
    *,
    keep: int | None = None,
    progress: bool = False,
    extra: Callable[[], Mapping[str, Any]] | None = None,
) -> PendingSave:
    """:func:`save` in a background thread; returns once the checkpoint's moment is taken.

    Raises:
        InvalidArgumentError: as :func:`save`, before the thread starts.
    """
    pending = PendingSave(
        StepwiseSave(tables, path, keep=keep, progress=progress, extra=extra)
    )
    pending.stats.captured.wait()
    return pending
