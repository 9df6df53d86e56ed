"""Saves written in a background thread: :func:`start_save` and :class:`PendingSave`.

:func:`start_save` returns once the checkpoint's moment is taken and writes the columns
in a background thread; a server's dispatcher instead takes a :class:`StepwiseSave`'s
capture steps itself between requests (:meth:`PendingSave.step`) and the thread starts
at the moment.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlreplay.checkpoint.save import StepwiseSave
from rlreplay.core.table import Table
from rlreplay.errors import CheckpointError, ReplayTimeoutError


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
            Exception: what the save raised.
        """
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
