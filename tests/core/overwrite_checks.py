"""Checks and tables shared by the overwrite-protocol tests (protocol, threads and
interleavings), so that all three hold the store and its tables to the same invariant."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rlreplay import ItemLayout, StepStore, Table


def assert_consistent(tables: Iterable[Table]) -> None:
    """Each table's size, live flags and both selectors agree."""
    for table in tables:
        index = table.index
        live = int(index.live.sum())
        # An idle remover (max_size reaching the capacity) keeps no items.
        removed = index.remover.size if index.remover_active else live
        assert index.size == live == index.sampler.size == removed, (
            table.name,
            index.size,
            live,
            index.sampler.size,
            removed,
        )


def check_window(data: dict, span: int | None = None) -> None:
    """Every sampled window (one per row of ``data``) holds consecutive steps of one
    writer (``w``) and, where steps carry one (``e``), of one episode."""
    w, i = data["w"], data["i"]
    if span is not None:
        assert w.shape[1] == span, w.shape
    assert (w == w[:, :1]).all(), w
    if "e" in data:
        assert (data["e"] == data["e"][:, :1]).all(), data["e"]
    assert (np.diff(i, axis=1) == 1).all(), i


def make_tables(store: StepStore, policies: list[str], span: int, size: int) -> list[Table]:
    """One table of sequences of ``span`` steps per policy over ``store``: ``block`` (a
    queue of ``size``), ``relocate`` (a stack of ``size``) or ``evict`` (a plain table)."""
    layout = ItemLayout.sequence(store.signature, span)
    tables = []
    for k, policy in enumerate(policies):
        if policy == "block":
            tables.append(Table.queue(f"queue{k}", size, store=store, layout=layout))
        elif policy == "relocate":
            tables.append(Table.stack(f"stack{k}", size, store=store, layout=layout))
        else:
            tables.append(Table(f"evict{k}", store=store, layout=layout))
    return tables
