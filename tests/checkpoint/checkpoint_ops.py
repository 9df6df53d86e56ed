"""Table configurations and a runner of seeded operation sequences, shared by the
checkpoint tests: the same operations on a table and on its restored copy must give the
same results."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from rlreplay import (
    Fifo,
    ItemLayout,
    Lifo,
    MaxHeap,
    MinHeap,
    Prioritized,
    ReplayTimeoutError,
    SampleToInsertRatio,
    StepStore,
    Table,
    TrajectoryWriter,
    Uniform,
    checkpoint,
)

SIGNATURE = {"step": "int64", "obs": ((3,), "float32")}


def _one(sampler=None, remover=None, **kwargs) -> dict[str, Table]:
    kwargs.setdefault("max_size", 24)
    kwargs.setdefault("capacity", 32)
    table = Table("t", signature=SIGNATURE, sampler=sampler, remover=remover, seed=7, **kwargs)
    return {"t": table}


def _shared() -> dict[str, Table]:
    """A prioritized table, a FIFO queue and a transition table over one store."""
    store = StepStore(SIGNATURE, 48)
    return {
        "p": Table("p", store=store, sampler=Prioritized(0.7), max_size=30, seed=1),
        "q": Table.queue("q", 10, store=store, seed=2),
        "tr": Table(
            "tr",
            store=store,
            layout=ItemLayout.transition(store.signature, next_fields="obs"),
            sampler=MaxHeap(),
            max_size=20,
            seed=3,
        ),
    }


CONFIGS: dict[str, Callable[[], dict[str, Table]]] = {
    "uniform": lambda: _one(Uniform(), Fifo()),
    "prioritized": lambda: _one(Prioritized(0.6), Prioritized(1.0), max_times_sampled=3),
    "fifo": lambda: _one(Fifo(), Fifo(), max_times_sampled=2),
    "lifo": lambda: _one(Lifo(), Uniform()),
    "min_heap": lambda: _one(MinHeap(), MaxHeap()),
    "ratio_limited": lambda: _one(Uniform(), Fifo(), rate_limiter=SampleToInsertRatio(2.0, 4, 6.0)),
    # max_size == capacity: the remover is idle (never asked), its state not saved
    "full_table_heap_remover": lambda: _one(Prioritized(0.8), MinHeap(), max_size=32),
    "full_table_fifo_remover": lambda: _one(Uniform(), Fifo(), max_size=32),
    "queue": lambda: {"q": Table.queue("q", 12, signature=SIGNATURE, seed=4)},
    "stack": lambda: {"s": Table.stack("s", 12, signature=SIGNATURE, seed=5)},
    "shared_store": _shared,
}

KINDS = ("insert", "sample", "update", "delete", "write", "can")


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"step": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32) * 0.5}


def run(tables: dict[str, Table], ops: list[tuple[str, int, int]], memory: dict) -> list:
    """Apply ``ops`` (kind, table number, size) and return what each call returned.

    ``memory`` carries the keys seen so far between calls (and across a checkpoint:
    pass a copy to each continuation).
    """
    names = sorted(tables)
    out: list = []
    for kind, which, n in ops:
        name = names[which % len(names)]
        t = tables[name]
        keys = memory.setdefault(name, [])
        if kind == "insert" and t.layout.is_rows:
            n = min(n, t.max_size)
            if not t.can_insert(n):
                out.append(("insert blocked", name))
                continue
            first = memory.setdefault("next", 0)
            memory["next"] = first + n
            prios = np.linspace(0.5, 3.0, n) * (1 + first % 5)
            try:
                new = t.insert(rows(first, n), prios, timeout=1e-3)
            except ReplayTimeoutError:  # a queue's items hold the rows
                out.append(("insert timed out", name))
                continue
            keys.extend(new.tolist())
            out.append(("insert", name, new.tolist()))
        elif kind in ("insert", "write"):
            out.append(_write(t, n, memory, keys))
        elif kind == "sample":
            n = min(n, t.max_size)
            if not t.can_sample(n):
                out.append(("sample blocked", name))
                continue
            s = t.sample(n, timeout=1e-3)
            keys.extend(s.info.keys.tolist())
            out.append(
                (
                    "sample",
                    name,
                    {k: v.tolist() for k, v in s.data.items()},
                    s.info.keys.tolist(),
                    s.info.probabilities.tolist(),
                    s.info.priorities.tolist(),
                    s.info.times_sampled.tolist(),
                    s.info.table_size,
                )
            )
        elif kind == "update" and keys:
            chosen = keys[-n:]
            prios = [math.fmod(0.37 * (i + n), 4.0) + 0.01 for i in range(len(chosen))]
            out.append(("update", name, t.update_priorities(np.array(chosen), np.array(prios))))
        elif kind == "delete" and keys:
            out.append(("delete", name, t.delete(np.array(keys[-1:]))))
            del keys[-1:]
        elif kind == "can":
            out.append(("can", name, t.can_insert(n), t.can_sample(n)))
    for name in names:
        info = tables[name].info().to_dict()
        info.pop("insert_blocked_s"), info.pop("sample_blocked_s")
        out.append(("info", info))
    return out


def _write(t: Table, n: int, memory: dict, keys: list) -> tuple:
    """A writer appending ``n + 1`` steps and making an item of each full window, then
    closing (writers are not part of checkpoints, so each write opens its own)."""
    span = t.layout.span
    if not t.can_insert(n):
        return ("write blocked", t.name)
    first = memory.setdefault("next", 0)
    memory["next"] = first + n + span
    made = []
    with TrajectoryWriter(t) as w:
        try:
            for i in range(n + span):
                step = {"step": np.int64(first + i), "obs": np.full(3, first + i, np.float32)}
                w.append(step, timeout=1e-3)
                if i + 1 >= span:
                    made.append(w.create_item(t, start=-span, priority=1.0 + i, timeout=1e-3))
        except ReplayTimeoutError:  # a queue's items hold the rows, or the limiter
            made.append("timed out")
    keys.extend(k for k in made if isinstance(k, int))
    return ("write", t.name, made)


def only_table(path, **options) -> Table:
    """The one table the checkpoint at ``path`` holds, built from it."""
    (table,) = checkpoint.restore(path, **options).values()
    return table
