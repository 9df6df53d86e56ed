"""A server's restore at start, and the section a server adds to its checkpoints.

A server's checkpoint holds its tables (saved by :mod:`rlreplay.checkpoint`) and, in
the manifest's extra section :data:`SERVER_STATE`, the state of every remote writer's
stream at the moment (:meth:`~rlreplay.net.server.sessions.WriterSessions.state`: its position,
the steps it retains, the replies kept for chunks sent again), made by
:func:`writer_streams_section`. :func:`restore_served` puts the newest valid checkpoint
back into the tables the server serves, in place, and the streams into its writer
sessions, so that a writer that sends again the chunks it had not seen acknowledged gets
their first replies (see :mod:`rlreplay.net.server.checkpoints` for what a restart keeps).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlreplay.errors import CheckpointMismatchError

if TYPE_CHECKING:
    from rlreplay.core.table import Table
    from rlreplay.net.server.sessions import WriterSessions

log = logging.getLogger("rlreplay.net")

SERVER_STATE = "server"  # the manifest's extra section holding the writers' streams


def writer_streams_section(sessions: WriterSessions) -> dict[str, Any]:
    """The manifest's extra section for the writers' streams now (taken at the moment):
    each stream's state keyed by its position (least recently used first) as a string."""
    states = sessions.state()
    return {SERVER_STATE: {"writers": {str(i): state for i, state in enumerate(states)}}}


def restore_served(
    directory: Path, tables: dict[str, Table], sessions: WriterSessions
) -> Path | None:
    """Restore the newest valid checkpoint in ``directory`` into ``tables`` (in place;
    their definitions must match the checkpoint's) and the writer streams it holds into
    ``sessions`` (those naming tables not served are dropped with a warning); returns its
    path, or ``None`` when the directory holds no checkpoint yet.

    Raises:
        CheckpointError: if checkpoints are there but none is valid, or the newest
            valid one holds other tables or definitions (the message says which and
            what to do); nothing is restored then.
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
