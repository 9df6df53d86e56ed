"""Queue and stack tables: the :class:`~rlreplay.core.table.Table` constructors
``Table.queue`` (FIFO, blocks writers) and ``Table.stack`` (LIFO, relocates steps), and
the store size that lets ``size`` items of a layout really fit.

The functions take the class as their first argument; ``Table`` binds them as
classmethods, so ``Table.queue(...)`` is the public spelling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlreplay.core.layout import ItemLayout
from rlreplay.core.rate_limiters import Queue
from rlreplay.core.selectors import Fifo, Lifo

if TYPE_CHECKING:
    from rlreplay.core.table import Table


def queue(cls: type[Table], name: str, size: int, **kwargs: Any) -> Table:
    """A FIFO queue: each item sampled once, inserts block when ``size`` items wait.

    Someone must sample the queue: with ``size`` items waiting, inserts (and appends
    to the store that would overwrite waiting items) block until a sampler takes one,
    up to their ``timeout``; a call blocked longer than ``warn_after`` seconds logs
    "no sampler is consuming this queue". Takes the same keyword arguments as
    :class:`Table` (``signature``/``store``, ``layout``, ...); with ``signature`` the
    queue's own store holds ``size`` items of the layout's span, plus one item's
    steps for the writer, so ``size`` items really fit.
    """
    return _ordered(cls, name, size, Fifo, "block", **kwargs)


def stack(cls: type[Table], name: str, size: int, **kwargs: Any) -> Table:
    """A LIFO stack: like :meth:`queue` but the newest item is sampled first (the
    oldest items wait longest: when the store wraps, their steps are copied to its
    head instead of blocking writers)."""
    return _ordered(cls, name, size, Lifo, "relocate", **kwargs)


def _ordered(
    cls: type[Table], name: str, size: int, selector: type, on_overwrite: str, **kwargs: Any
) -> Table:
    """A table of ``size`` items, each sampled once, in ``selector``'s order; a table
    creating its own store sizes it for ``size`` items of its layout's span plus one."""
    own_store = "store" not in kwargs and "capacity_bytes" not in kwargs
    if "signature" in kwargs and own_store and isinstance(size, int):
        layout = kwargs.get("layout")
        span = layout.span if isinstance(layout, ItemLayout) else 1
        kwargs.setdefault("capacity", max(2 * size, (size + 1) * span))
    return cls(
        name,
        sampler=selector(),
        remover=selector(),
        max_size=size,
        max_times_sampled=1,
        rate_limiter=Queue(size),
        on_overwrite=on_overwrite,
        **kwargs,
    )
