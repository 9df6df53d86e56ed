"""A client's ``checkpoint`` request, parked on the server until its checkpoint is published.

``client.checkpoint()`` (and ``rlreplay checkpoint ADDRESS``) asks a server with a
checkpoint directory for a checkpoint that holds everything acknowledged before the
request. The server answers it as a parked job (see :mod:`rlreplay.net.server.jobs`): a
save under way (the server's, or an in-process save of the same stores) is awaited
first, then the requested one is started by the server's
:class:`~rlreplay.net.server.checkpoints.ServerCheckpoints` and the job is answered with its
path once it is published, or with the error that kept it from being written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlreplay.errors import CheckpointError, InvalidArgumentError, ReplayTimeoutError
from rlreplay.net.server.checkpoint_changes import stores_busy
from rlreplay.net.server.jobs import Job, Reply

if TYPE_CHECKING:
    from rlreplay.core.table import Table
    from rlreplay.net.server.sessions import WriterSessions


class CheckpointTaker(Protocol):
    """What a request needs of the server's checkpoints
    (:class:`~rlreplay.net.server.checkpoints.ServerCheckpoints`)."""

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

    It is answered with ``{"path": ...}``; when its deadline passes first it gets a
    :class:`~rlreplay.errors.ReplayTimeoutError` (the checkpoint is still written).
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
