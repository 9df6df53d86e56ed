"""Table and store definitions as a checkpoint records them, and how two are compared.

Restoring into given tables refuses every difference with
:class:`CheckpointMismatchError`, except those :func:`compare` marks adaptable under
``adapt=True``. See docs/checkpoints.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.core import idle_remover
from rlreplay.core.keys import GENERATIONS
from rlreplay.core.selectors import selector_from_config
from rlreplay.errors import CheckpointMismatchError

if TYPE_CHECKING:
    from rlreplay.core.storage import StepStore
    from rlreplay.core.table import Table


def store_definition(store: StepStore) -> dict[str, Any]:
    """The store's signature, capacity and lanes."""
    return {
        "signature": store.signature.to_json(),
        "capacity": store.capacity,
        "lanes": store.lanes,
    }


def table_definition(table: Table) -> dict[str, Any]:
    """Everything but the store that rebuilds an equal, empty table."""
    return {
        "layout": table.layout.to_json(),
        "sampler": table.sampler.config(),
        "remover": table.remover.config(),
        "rate_limiter": table.rate_limiter.config(),
        "max_size": table.max_size,
        "max_times_sampled": table.max_times_sampled,
        "default_priority": table.default_priority,
        "on_overwrite": table.on_overwrite,
        "warn_after": table.warn_after,
    }


# Differences adapt=True may take, and what each needs.
_ADAPTABLE = {"capacity", "max_size", "rate_limiter", "default_priority", "warn_after"}


_PER_FIELD = ("signature", "layout")


class _Absent:
    """A field one of the two definitions does not have (shown as ``absent``)."""

    def __repr__(self) -> str:
        return "absent"


_ABSENT = _Absent()


def _selector_adaptable(saved: dict, given: dict) -> bool:
    """Selectors of one type differing only in their arguments (priority_exponent)."""
    return saved.get("type") == given.get("type")


def compare(
    where: str, saved: dict[str, Any], given: dict[str, Any]
) -> list[tuple[str, Any, Any, bool]]:
    """``(field, saved, given, adaptable)`` for every field of two definitions that differs."""
    out = []
    for key in saved.keys() | given.keys():
        a, b = saved.get(key), given.get(key)
        if key == "warn_after" or a == b:
            continue
        adaptable = key in _ADAPTABLE or (
            key in ("sampler", "remover") and _selector_adaptable(a or {}, b or {})
        )
        if key in _PER_FIELD and isinstance(a, dict) and isinstance(b, dict):
            out += [
                (
                    f"{where}.{key}[{field!r}]",
                    a.get(field, _ABSENT),
                    b.get(field, _ABSENT),
                    adaptable,
                )
                for field in a.keys() | b.keys()
                if a.get(field) != b.get(field)
            ]
        else:
            out.append((f"{where}.{key}", a, b, adaptable))
    return sorted(out, key=lambda d: d[0])


def refuse(differences: list[tuple[str, Any, Any, bool]], adapt: bool, source: str) -> None:
    """Raise for the differences ``adapt`` does not allow.

    Raises:
        CheckpointMismatchError: listing each difference and whether ``adapt=True`` takes it.
    """
    blocking = [d for d in differences if not (adapt and d[3])]
    if not blocking:
        return
    lines = "; ".join(
        f"{name}: checkpoint {saved!r}, given {given!r}"
        + (" (adapt=True takes this)" if ok else " (cannot be adapted)")
        for name, saved, given, ok in blocking
    )
    hint = (
        "pass adapt=True to take the adaptable ones"
        if all(d[3] for d in blocking)
        else "build the tables with the checkpoint's definitions (or restore without "
        "tables= to build them from the checkpoint)"
    )
    raise CheckpointMismatchError(
        f"the checkpoint {source} does not match the tables given: {lines}; {hint}"
    )


_SLOT_ARRAYS = ("priority", "generation", "times_sampled", "live", "extent")


def check_capacity(name: str, next_id: int, old: int, new: int) -> None:
    """Raises CheckpointMismatchError if ``new`` rows cannot hold the stored steps."""
    stored = min(next_id, old)
    if new < stored:
        raise CheckpointMismatchError(
            f"the store of table {name!r} holds {stored} steps in the checkpoint, more than "
            f"the given capacity={new}; give a capacity of at least {stored}"
        )


def move_columns(
    columns: dict[str, np.ndarray], next_id: int, old: int, new: int
) -> dict[str, np.ndarray]:
    """New columns of ``new`` rows with every stored step at row ``id % new``."""
    ids = np.arange(max(0, next_id - old), next_id, dtype=np.int64)
    out = {}
    for path, col in columns.items():
        moved = np.zeros((new, *col.shape[1:]), col.dtype)
        moved[ids % new] = col[ids % old]
        out[path] = moved
    return out


def slot_map(next_id: int, old: int, new: int) -> np.ndarray:
    """New slot of each old slot (-1 for rows holding no stored step)."""
    out = np.full(old, -1, dtype=np.int64)
    ids = np.arange(max(0, next_id - old), next_id, dtype=np.int64)
    out[ids % old] = ids % new
    return out


def _rebuilt(
    saved_config: dict,
    given_config: dict,
    state: dict,
    old: int,
    new: int,
    moved: np.ndarray | None,
    priority: np.ndarray,
) -> dict[str, Any]:
    """A selector state for ``given_config`` over ``new`` slots, in the saved one's order."""
    saved = selector_from_config(saved_config)
    saved.bind(old)
    saved.check_state(state)
    saved.load_state(state)
    order = saved.rebuild_order()
    if moved is not None:
        order = moved[order]
    rebuilt = selector_from_config(given_config)
    rebuilt.bind(new)
    rebuilt.insert(order.astype(np.int64), priority[order])
    return rebuilt.state()


def with_remover_state(state: dict[str, Any], remover: Any) -> dict[str, Any]:
    """``state`` with its idle remover's left-out state made from the items, oldest first."""
    if state.get("remover") is not None:
        return state
    if isinstance(remover, dict):
        remover = selector_from_config(remover)
    newest = int(state.get("newest", len(state["live"]) - 1))
    made = idle_remover.idle_state(remover, state["live"], newest, state["priority"])
    return {**state, "remover": made}


def adapt_index(
    name: str,
    state: dict[str, Any],
    saved: dict[str, Any],
    given: dict[str, Any],
    next_id: int,
    old: int,
    new: int,
) -> dict[str, Any]:
    """The index ``state`` (saved as ``saved`` over ``old`` slots) for ``given`` over ``new``.

    Raises:
        CheckpointMismatchError: if the given ``max_size`` cannot hold the items.
    """
    if state["size"] > given["max_size"]:
        raise CheckpointMismatchError(
            f"table {name!r} holds {state['size']} items in the checkpoint, more than the "
            f"given max_size={given['max_size']}; give a max_size of at least {state['size']}"
        )
    state = with_remover_state(state, saved["remover"])
    out = dict(state)
    moved = None
    if new != old:
        moved = slot_map(next_id, old, new)
        live = np.flatnonzero(state["live"])
        targets = moved[live]
        for key in _SLOT_ARRAYS:
            if key in state:
                arr = np.zeros(new, state[key].dtype)
                arr[targets] = state[key][live]
                out[key] = arr
        # Keys carry slots: move the origin half-way round so old keys are refused.
        out["origin"] = (int(state["origin"]) + GENERATIONS // 2) % GENERATIONS
    for role in ("sampler", "remover"):
        if moved is not None or saved[role] != given[role]:
            out[role] = _rebuilt(
                saved[role], given[role], state[role], old, new, moved, out["priority"]
            )
    return out
