"""The remover of a table that can never fill with a free slot: kept idle, at no memory.

A remover is asked for victims only when an insert finds the table at ``max_size`` and
the new item's slot free. A table holds at most one item per slot, so when ``max_size``
reaches the store's capacity a full table holds every slot: a new item's slot then holds
an item, which the store's overwrite evicts first (see overwrite.py), and the remover is
never asked. Such a table's :class:`~rlreplay.core.item_index.ItemIndex` leaves its
remover unbound (a Fifo remover's links are 8 bytes per slot, a heap's more) and skips
every call to it. A checkpoint saves no state for it; the remover's index is made, from
:func:`idle_order`, only where a checkpoint is restored into a table that does use its
remover (of another capacity or ``max_size``), so that it finds the items in an order.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np


def remover_is_idle(capacity: int, max_size: int) -> bool:
    """Whether a table of ``max_size`` items over ``capacity`` slots never asks its
    remover for victims (``max_size >= capacity``)."""
    return max_size >= capacity


def idle_order(live: np.ndarray, newest: int) -> np.ndarray:
    """The held slots (``live`` flags) oldest first, as an idle remover's order: in ring
    order from the slot after ``newest`` (the slot of the item inserted last), which is
    their insertion order where items are inserted in the order of their anchors."""
    held = np.flatnonzero(live)
    start = (newest + 1) % len(live)
    return np.concatenate([held[held >= start], held[held < start]])


def bound_copy(remover: Any, capacity: int) -> Any:
    """An unbound copy of ``remover`` (its configuration) bound to ``capacity`` slots."""
    made = copy.copy(remover)
    made.bind(capacity)
    return made


def idle_state(
    remover: Any,
    live: np.ndarray,
    newest: int,
    priority: np.ndarray,
    into: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """The state an active ``remover`` would have holding the held slots in
    :func:`idle_order`, with their priorities (what a restore gives an active remover in
    place of an idle one's state)."""
    made = bound_copy(remover, len(live))
    order = idle_order(live, newest)
    if len(order):
        made.insert(order, np.asarray(priority[order], dtype=np.float64))
    return made.state(into)
