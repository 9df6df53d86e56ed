"""The remover of a table that can never fill with a free slot: kept idle, at no memory.

When ``max_size`` reaches the store's capacity the overwrite evicts first, so the remover
is never asked and stays unbound.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np


def remover_is_idle(capacity: int, max_size: int) -> bool:
    """Whether a table of ``max_size`` items over ``capacity`` slots never asks its remover."""
    return max_size >= capacity


def idle_order(live: np.ndarray, newest: int) -> np.ndarray:
    """The held slots oldest first, in ring order from the slot after ``newest``."""
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
    """The state an active ``remover`` would have holding the slots in :func:`idle_order`."""
    made = bound_copy(remover, len(live))
    order = idle_order(live, newest)
    if len(order):
        made.insert(order, np.asarray(priority[order], dtype=np.float64))
    return made.state(into)
