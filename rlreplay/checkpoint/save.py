"""Saving tables: capture, stream, publish atomically, keep the last K.

:func:`save` runs in the calling thread; every other thread keeps using the tables
meanwhile (the store's lock is held only to capture the per-item state and to copy each
chunk of rows, see :mod:`~rlreplay.checkpoint.snapshot` and
:mod:`~rlreplay.checkpoint.streaming`). It takes the steps of a :class:`StepwiseSave`
back to back; a caller that must go on with other work between them (a server's
dispatcher) takes them itself. :func:`start_save` runs a
save in a background thread.

Publishing: everything is written into a temporary sibling directory, each file fsynced,
the manifest last, the directory fsynced, then renamed to ``ckpt-<sequence>`` in one
atomic step and the parent fsynced. A crash at any moment leaves either the complete
checkpoint or a temporary directory that restore never looks at (and a later save
deletes once its process is gone).

:func:`start_save` returns once the checkpoint's moment is taken and writes the columns
in a background thread (:class:`PendingSave`); a server's dispatcher instead takes a
:class:`StepwiseSave`'s capture steps itself between requests (:meth:`PendingSave.step`)
and the thread starts at the moment.
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
        bytes: bytes this save wrote (files reused from the previous checkpoint not
            counted).
        reused_bytes: bytes of column files linked (or copied) from the previous
            checkpoint instead (see :mod:`~rlreplay.checkpoint.increments`).
        total_bytes: bytes of every file the checkpoint lists.
        capture_held_s, chunk_held_s: the longest lock holds, in seconds: of the
            per-item state's capture (the moment's hold, or one slice of a large index,
            see :mod:`~rlreplay.checkpoint.snapshot`) and of one piece of the columns'
            copy.
        aside_peak_bytes: the most bytes of rows copied aside at once.
        state_peak_bytes: the most bytes of per-item state (the item index's copies)
            held in memory at once: the whole state for a small index, the slice
            buffers and the changed entries' values for a large one, whose slices go
            to their files as they are copied (see
            :mod:`~rlreplay.checkpoint.state_files`).
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
    """A save whose capture the caller takes a step at a time (see
    :class:`~rlreplay.checkpoint.snapshot.Capture`); :func:`save` takes the steps back to
    back, a server's dispatcher one between two requests, so that no request waits for
    more than one step. The last step is the checkpoint's moment: the checkpoint is
    named, each store's moment taken (one short lock hold each) and ``extra`` called,
    with no other save taking its moment meanwhile. :meth:`write` then streams the
    columns and publishes the checkpoint.

    Args:
        tables: as :func:`save`.
        path: as :func:`save`.
        keep: as :func:`save`.
        progress: as :func:`save`.
        extra: as :func:`save`.
        stats: filled with the save's figures (a new :class:`SaveStats` when ``None``).
        slice_bytes: bytes one step of a large index's capture copies (default
            ``snapshot.SLICE_BYTES``).
        buffers_in_thread: make the capture's buffers in a helper thread while
            :meth:`step` returns at once.

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
        # the lock on the temporary directory while this save works in it (see prune)
        self._hold: retention.DirectoryHold | None = None
        self.moment_taken = False
        self.failed = False

    @property
    def done(self) -> bool:
        """Whether the checkpoint's moment is taken (or a step failed)."""
        return self.moment_taken or self.failed

    def step(self) -> None:
        """Take the capture's next step; the last one takes the checkpoint's moment.
        A step that raises abandons the save (nothing is written; :attr:`done`).

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
        """Create the directory the checkpoints go into (and its parents).

        Raises:
            CheckpointError: naming it, when it cannot be created (a path under a file,
                or one this process may not write).
        """
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CheckpointError(
                f"the checkpoint could not be written into {str(self.root)!r}: "
                f"{error.strerror or error} ({type(error).__name__}); give a directory "
                "this process can create and write"
            ) from error

    def _staging(self) -> Path:
        """A temporary directory for the files a capture in slices writes before the
        moment (named as a save's temporary directory of sequence 0, so that a later
        save deletes it if this process dies), renamed at the moment."""
        self._make_root()
        staging = self.root / _temporary_name(0)
        staging.mkdir()
        self._hold = retention.DirectoryHold(staging)  # kept through the rename to tmp
        return staging

    def _take_moment(self) -> None:
        # Naming and the moment under one process-wide lock, so that a later sequence
        # number never holds an earlier moment; the columns stream without it.
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
        """Give up a save whose moment is not taken (the indexes stop noting changes)."""
        if not self.done:
            self.failed = True
            self.capture.abandon()
            self._let_go()
            self.stats.captured.set()

    def write(self) -> Path:
        """Stream the columns, write the manifest and publish the checkpoint (after the
        moment: :attr:`done` and not failed); returns its directory.

        Raises:
            CheckpointError: if the moment was not taken.
            OSError: if writing fails (the temporary directory is removed; nothing is
                published).
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
    """Save ``tables`` (and the stores under them) as a new checkpoint under ``path``.

    Tables over one store are saved as of one moment; tables over different stores each
    as of their store's moment, one right after another. Other threads keep inserting
    and sampling meanwhile; what they do after the moment is not in this checkpoint.

    Args:
        tables: a table, or a list or dict of tables with distinct names.
        path: directory of checkpoints (created if missing); the checkpoint is its new
            subdirectory ``ckpt-<sequence>``.
        keep: keep only this many newest checkpoints under ``path`` (``None``: all).
        progress: show a progress bar (tqdm, when installed).
        stats: filled with the save's figures when given.
        extra: called right after the tables' state is taken, in the same thread; what
            it returns (a dict of JSON values, numpy arrays and dicts of those) is saved
            with the checkpoint (the manifest's ``extra``) and returned by
            :func:`~rlreplay.checkpoint.restore.restore_with_extra`. A server saves its
            writers' streams this way.

    Returns:
        The published checkpoint's directory.

    Raises:
        InvalidArgumentError: for bad ``tables``, ``path`` or ``keep`` (nothing written).
        ClosedError: if a table is closed.
        CheckpointError: if another save of the same store is under way.
        OSError: if writing fails (the temporary directory is removed; nothing is
            published).
    """
    steps = StepwiseSave(tables, path, keep=keep, progress=progress, stats=stats, extra=extra)
    while not steps.done:
        steps.step()
    return steps.write()


def _write(
    snap: Snapshot, tmp: Path, progress: bool, stats: SaveStats, extra: Any = None
) -> dict[str, Any]:
    """Write every array of ``snap`` (and of ``extra``) into ``tmp``; returns the
    manifest."""
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
    for s in snap.stores:  # first, while no row is streamed (a chunk left out streams)
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
    """Rename ``tmp`` to the first free ``ckpt-<sequence>`` from ``seq`` on (another
    process may publish into ``root`` too); fsync ``root``."""
    for attempt in range(1000):
        final = root / retention.name_of(seq + attempt)
        if final.exists():
            continue
        try:
            os.rename(tmp, final)
        except OSError:
            if final.exists():  # taken meanwhile: try the next number
                continue
            raise
        retention.fsync_dir(root)
        return final
    raise CheckpointError(f"no free checkpoint name under {root} after {seq}")


class PendingSave:
    """A save written in a background thread (from :func:`start_save`, or from a
    :class:`StepwiseSave` whose capture the caller steps with :meth:`step`).

    Args:
        steps: the save.
        capture_here: the caller takes the capture's steps (:meth:`step`); the thread
            starts once the moment is taken. Otherwise the thread takes them too.
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
        """Whether the caller still has capture steps to take (:meth:`step`)."""
        return self._thread is None and self._error is None

    def step(self) -> None:
        """Take the capture's next step in the calling thread; once the moment is taken,
        the columns are written in a background thread. A failure is kept for
        :meth:`result` (the save is then done)."""
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
        """Give up the capture if its moment is not taken yet (:meth:`result` then
        raises a :class:`~rlreplay.errors.CheckpointError`)."""
        if self.capturing:
            self.steps.abandon()
            self._error = CheckpointError("the checkpoint was abandoned before its moment")

    def done(self) -> bool:
        """Whether the save has finished (published or failed)."""
        if self._thread is None:
            return self._error is not None
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> Path:
        """Wait up to ``timeout`` seconds (``None``: without limit) and return the
        checkpoint's directory.

        Raises:
            ReplayTimeoutError: (a ``TimeoutError``) if the save has not finished within
                ``timeout``; it goes on, ask again.
            InvalidArgumentError: for a ``timeout`` that is not a number >= 0 or None
                (``0``: look without waiting).
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
    """:func:`save` in a background thread; the arguments are checked first. Returns
    once the checkpoint's moment is taken (the tables' small per-item state, and
    ``extra``), so the checkpoint holds what the caller did before the call.

    Raises:
        InvalidArgumentError: as :func:`save`, before the thread starts.
    """
    pending = PendingSave(
        StepwiseSave(tables, path, keep=keep, progress=progress, extra=extra)
    )
    pending.stats.captured.wait()
    return pending
