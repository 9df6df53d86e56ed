"""Whether a server's periodic checkpoint has anything new to save, and whether it may start.

An idle server writes nothing: a periodic checkpoint is skipped when nothing changed
since the last checkpoint's moment. Besides the requests the server notes as changing
(see :mod:`rlreplay.net.server.checkpoints`), :func:`fingerprint` sums up, in a few counters,
what a checkpoint of the served tables and writer streams would hold, so that changes
made in process to a served table are seen too. A save may start only when no other save
streams the same stores or copies their indexes in slices (:func:`stores_busy`: an
in-process save, which the server waits for).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlreplay.checkpoint.streaming import ColumnStream
from rlreplay.net.server.jobs import sampler_mass

if TYPE_CHECKING:
    from rlreplay.core.table import Table
    from rlreplay.net.server.sessions import WriterSessions


def stores_busy(tables: dict[str, Table]) -> bool:
    """Whether a checkpoint streams one of the tables' stores now, or copies one of
    their indexes in slices (an in-process save: a second one would be refused)."""
    return any(
        t.index.changes is not None or any(isinstance(o, ColumnStream) for o in t.store.observers)
        for t in tables.values()
    )


def fingerprint(tables: dict[str, Table], sessions: WriterSessions) -> tuple:
    """What a checkpoint of ``tables`` and ``sessions`` holds, in a few counters: equal
    fingerprints mean nothing a checkpoint saves changed in between (a sample changes the
    limiter's ``samples``; a priority update the sampler's total weight; an appended step
    the store's next step id). Takes each table's lock in turn."""
    parts: list[Any] = [len(sessions), sessions.dropped]
    for name in sorted(tables):
        t = tables[name]
        with t.lock:
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
