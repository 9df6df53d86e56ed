"""Restoring tables from a checkpoint: choose it, check it, load it, build or fill tables."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.checkpoint.definitions import (
    adapt_index,
    check_capacity,
    compare,
    move_columns,
    refuse,
    store_definition,
    table_definition,
    with_remover_state,
)
from rlreplay.checkpoint.loading import Loaded, check_path, load
from rlreplay.checkpoint.snapshot import as_tables
from rlreplay.core.layout import ItemLayout
from rlreplay.core.rate_limiters import RateLimiter
from rlreplay.core.selectors import selector_from_config
from rlreplay.core.specs import Signature
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import (
    CheckpointMismatchError,
    ClosedError,
    InvalidArgumentError,
    describe,
)


def _build(loaded: Loaded) -> dict[str, Table]:
    """New stores and tables from the manifest, holding the checkpoint's state."""
    manifest = loaded.manifest
    stores = []
    for s, cols in zip(manifest["stores"], loaded.columns):
        store = StepStore(
            Signature.from_json(s["signature"]), s["capacity"], s["lanes"], columns=cols
        )
        store.load_state(s["state"])
        stores.append(store)
    out = {}
    for t, state in zip(manifest["tables"], loaded.states):
        d, store = t["definition"], stores[t["store"]]
        table = Table(
            t["name"],
            store=store,
            layout=ItemLayout.from_json(d["layout"], store.signature),
            sampler=selector_from_config(d["sampler"]),
            remover=selector_from_config(d["remover"]),
            max_size=d["max_size"],
            rate_limiter=RateLimiter(**d["rate_limiter"]),
            max_times_sampled=d["max_times_sampled"],
            default_priority=d["default_priority"],
            on_overwrite=d["on_overwrite"],
            warn_after=d.get("warn_after"),
        )
        _load_table(table, state)
        out[table.name] = table
    return out


def _load_table(table: Table, state: dict[str, Any]) -> None:
    """Put a table's saved state into it; an idle remover's state is made from the items."""
    index = state["index"]
    if table.index.remover_active:
        index = with_remover_state(index, table.index.remover)
    table.index.load_state(index)
    table.rate_limiter.load_state(state["rate_limiter"])
    table.rng.bit_generator.state = state["rng"]
    table.draws.replan()


def _plan_into(loaded: Loaded, given: list[Table], adapt: bool) -> list[tuple]:
    """Check ``given`` against the checkpoint; per store, what to swap in."""
    manifest = loaded.manifest
    closed = [t.name for t in given if t.closed]
    if closed:
        raise ClosedError(f"tables {closed} are closed; build new tables to restore into")
    by_name = {t["name"]: i for i, t in enumerate(manifest["tables"])}
    missing = [t.name for t in given if t.name not in by_name]
    if missing:
        raise CheckpointMismatchError(
            f"tables {missing} are not in the checkpoint {loaded.directory.name}, which holds "
            f"{sorted(by_name)}; pass only tables it holds"
        )
    groups: dict[int, tuple[StepStore, list[Table]]] = {}
    for t in given:
        si = manifest["tables"][by_name[t.name]]["store"]
        store, members = groups.setdefault(si, (t.store, []))
        if store is not t.store:
            raise CheckpointMismatchError(
                f"table {t.name!r} shares a store with {members[0].name!r} in the checkpoint "
                "but not in the tables given; build them over one store"
            )
        members.append(t)
    if len({id(s) for s, _ in groups.values()}) != len(groups):
        raise CheckpointMismatchError(
            "tables given over one store were over different stores in the checkpoint; "
            "build them as the checkpoint had them"
        )
    plans = []
    for si, (store, members) in groups.items():
        others = [t.name for t in store.overwrite.tables() if t not in members]
        if others:
            raise CheckpointMismatchError(
                f"tables {others} use the store of {[t.name for t in members]} but are not "
                "restored; pass them too (if the checkpoint holds them) or close them"
            )
        saved_store = manifest["stores"][si]
        where = f"store of {members[0].name!r}"
        diffs = compare(
            where,
            {k: saved_store[k] for k in ("signature", "capacity", "lanes")},
            store_definition(store),
        )
        table_diffs = [
            compare(t.name, manifest["tables"][by_name[t.name]]["definition"], table_definition(t))
            for t in members
        ]
        refuse(diffs + [d for ds in table_diffs for d in ds], adapt, loaded.directory.name)
        old, new = saved_store["capacity"], store.capacity
        next_id = saved_store["state"]["next_id"]
        columns = loaded.columns[si]
        if old != new:
            check_capacity(members[0].name, next_id, old, new)
            columns = move_columns(columns, next_id, old, new)
        swaps = []
        for t, ds in zip(members, table_diffs):
            i = by_name[t.name]
            state = dict(loaded.states[i])
            if ds or old != new:
                state["index"] = adapt_index(
                    t.name,
                    state["index"],
                    manifest["tables"][i]["definition"],
                    table_definition(t),
                    next_id,
                    old,
                    new,
                )
            swaps.append((t, state))
        plans.append((store, saved_store["state"], columns, swaps))
    return plans


def _swap(plans: list[tuple]) -> None:
    """Load the planned states into the stores and tables, each under its store's lock. Must
    not fail: every check is in the plan, so a restore changes nothing or everything."""
    for store, state, columns, swaps in plans:
        with store.mutex:
            store.load_state(state, columns=columns)
            for table, table_state in swaps:
                _load_table(table, table_state)
            store.waits.wake_all()


def _check_flags(**flags: Any) -> None:
    """Refuse a flag of :func:`restore` that is not a bool (``adapt="no"`` would count as true)."""
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)) and not (name == "verify" and value is None):
            allowed = "True, False or None" if name == "verify" else "True or False"
            raise InvalidArgumentError(f"{name}={describe(value)} must be {allowed}")


def restore(
    path: str | os.PathLike,
    tables: Table | Sequence[Table] | Mapping[str, Table] | None = None,
    *,
    adapt: bool = False,
    mmap: bool = False,
    verify: bool | None = None,
    progress: bool = False,
) -> dict[str, Table]:
    """Restore tables from the checkpoint at ``path``.

    Args:
        path: a checkpoint directory (``ckpt-*``), or the directory saves wrote into (the
            newest complete, valid checkpoint is taken; others are skipped with a warning).
        tables: tables to load into, their definitions (signature, layout, capacity,
            max_size, selectors, rate limiter) checked against the checkpoint's; their items
            and counters are replaced by the checkpoint's. ``None`` builds the tables.
        adapt: accept differences that can be adapted (a capacity or max_size that holds
            what was saved, another rate limiter or selector arguments).
        mmap: serve the step columns from the checkpoint's files, mapped copy-on-write.
        verify: also check the checksums of an ``mmap`` restore's column files (default:
            sizes and headers only); read files are always checked.
        progress: show a progress bar (tqdm, when installed).

    Returns:
        The tables by name (the given objects when ``tables`` is given).

    Raises:
        CheckpointNotFoundError: if no complete, valid checkpoint is at ``path``.
        CheckpointCorruptError: if the checkpoint directory given is damaged.
        CheckpointVersionError: if it is of another format version.
        CheckpointMismatchError: if the tables given do not match it.
        InvalidArgumentError: for bad arguments. Nothing changes when any is raised.
    """
    _check_flags(adapt=adapt, mmap=mmap, progress=progress, verify=verify)
    root = check_path(path)
    given = None if tables is None else as_tables(tables)
    loaded = load(root, bool(mmap), verify, bool(progress))
    if given is None:
        return _build(loaded)
    plans = _plan_into(loaded, given, bool(adapt))
    _swap(plans)
    return {t.name: t for t in given}


def restore_with_extra(
    path: str | os.PathLike,
    tables: Table | Sequence[Table] | Mapping[str, Table],
    *,
    adapt: bool = False,
    progress: bool = False,
) -> tuple[Path, dict[str, Table], dict[str, Any] | None]:
    """:func:`restore` into ``tables``, also returning the checkpoint's directory and ``extra``."""
    root = check_path(path)
    given = as_tables(tables)
    loaded = load(root, False, None, bool(progress))
    _swap(_plan_into(loaded, given, bool(adapt)))
    return loaded.directory, {t.name: t for t in given}, loaded.extra
