"""Table and store definitions as a checkpoint records them, and how two are compared.

A *definition* is what a user chose when building a table (signature, capacity, lanes,
layout, selectors, rate limiter, sizes), as opposed to its *state* (steps, items,
counters). Restoring into tables the user built checks their definitions against the
checkpoint's: every difference is refused with :class:`CheckpointMismatchError`, except
those :func:`compare` marks adaptable when the user passes ``adapt=True``:

* a larger (or smaller) ``capacity``, if it holds every stored step: the steps and
  items move to their new rows, so item keys issued before the save are refused
  afterwards as keys of another table;
* another ``max_size``, if it holds every item;
* another rate limiter (its counters carry over) and another ``priority_exponent`` or
  ``default_priority`` (the selectors are rebuilt from the items' priorities).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def _selector_adaptable(saved: dict, given: dict) -> bool:
    """Selectors of one type differing only in their arguments (priority_exponent)."""
    return saved.get("type") == given.get("type")


def compare(
    where: str, saved: dict[str, Any], given: dict[str, Any]
) -> list[tuple[str, Any, Any, bool]]:
    """``(field, saved, given, adaptable)`` for every field of two definitions that
    differs (``warn_after`` is a runtime setting and never counts)."""
    out = []
    for key in saved.keys() | given.keys():
        a, b = saved.get(key), given.get(key)
        if key == "warn_after" or a == b:
            continue
        adaptable = key in _ADAPTABLE or (
            key in ("sampler", "remover") and _selector_adaptable(a or {}, b or {})
        )
        out.append((f"{where}.{key}", a, b, adaptable))
    return sorted(out, key=lambda d: d[0])


def refuse(differences: list[tuple[str, Any, Any, bool]], adapt: bool, source: str) -> None:
    """Raise for the differences ``adapt`` does not allow.

    Raises:
        CheckpointMismatchError: listing each difference, saved and given, and whether
            ``adapt=True`` would take it.
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
