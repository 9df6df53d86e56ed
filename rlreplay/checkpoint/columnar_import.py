"""Pre-filling tables from a columnar dataset: every check first, then one append.

:func:`import_npz` appends a dataset's steps (see
:mod:`rlreplay.checkpoint.columnar_format`) to a store and creates each table's items
over them with the dataset's priorities; the items get new keys (returned, aligned with
the file's ``key`` arrays) and start with ``times_sampled`` 0. Everything is checked
before anything is inserted (the file, the store's columns and lanes, each table's
layout, sizes and whether the store and the rate limiters admit the whole import now),
so a failed import inserts nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.checkpoint.columnar_format import dataset_meta, open_dataset, store_and_tables
from rlreplay.core.keys import check_priorities
from rlreplay.core.layout import ItemLayout
from rlreplay.core.specs import Signature
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import DatasetError, InvalidArgumentError, SignatureError, describe

__all__ = ["import_npz"]


def import_npz(
    path: str | os.PathLike,
    target: Table | Sequence[Table] | StepStore,
) -> dict[str, np.ndarray]:
    """Pre-fill tables from a columnar dataset: its steps are appended to the store and
    each table's items are created over them, with the dataset's priorities.

    Everything is checked before anything is inserted: the file's format, the store's
    signature and lanes against the dataset's (column by column), each table's layout
    against the one it was exported with, the store's capacity and each table's
    ``max_size``, and whether the rate limiters and the store admit the whole import
    now (an import never waits: a queue's unconsumed items on the rows the steps would
    overwrite, or a limiter that holds inserts back, refuse it). A failed import inserts
    nothing.

    Args:
        path: a file written by :func:`export_npz`.
        target: a :class:`Table`, tables over one store (each must be in the dataset, by
            name), or a :class:`StepStore` (steps only).

    Returns:
        Table name to the int64 keys of its new items, aligned with the dataset's
        ``tables/<name>/key`` (so old keys can be mapped to new ones).

    Raises:
        DatasetError: for a file that is not a columnar dataset, a table the dataset
            lacks or whose layout differs, steps or items that do not fit, or a rate
            limiter or queue that would make the import wait.
        SignatureError: if the store's columns differ from the dataset's (the message
            names the column, its shapes and dtypes).
        InvalidArgumentError: if the store cannot hold what writers retain plus the
            dataset's steps.
    """
    store, tables = store_and_tables(target, "target")
    with open_dataset(path) as data:
        meta = dataset_meta(data, path)
        check_signature(meta, store, path)
        n = meta["end_id"] - meta["first_id"]
        if n > store.capacity:
            raise DatasetError(
                f"dataset {describe(str(path))} holds {n} steps, more than the store's "
                f"capacity={store.capacity}; import into a larger store, or export a range "
                "of at most capacity steps (first_id/end_id)"
            )
        plans = [item_plan(meta, data, t, n, path) for t in tables]
        steps = {p: data[f"steps/{p}"] for p in store.signature.paths}
    if any(len(a) != n for a in steps.values()):
        raise DatasetError(
            f"dataset {describe(str(path))} has columns of different lengths; the file is "
            "damaged: export it again"
        )
    with store.mutex:
        if n and not store.overwrite.has_room(n):
            raise DatasetError(
                f"the {n} steps of dataset {describe(str(path))} would overwrite rows that "
                "a queue table (on_overwrite='block') still holds items on; sample them "
                "first, or import into a larger store"
            )
        for table, (anchors, _, _) in zip(tables, plans):
            if not table.admission.can_insert(len(anchors), 0):
                raise DatasetError(
                    f"table {table.name!r}'s rate limiter ({table.rate_limiter!r}) does not "
                    f"admit {len(anchors)} inserts now (or the table is closed); import into "
                    "a table whose limiter admits them (e.g. MinSize), then sample"
                )
        if n == 0:
            return {t.name: np.zeros(0, dtype=np.int64) for t in tables}
        # Checked above with the lock held throughout: neither call waits or fails now.
        first = store.append(steps)
        return {
            table.name: table.create_items(anchors + first, prios, lengths=lengths)
            for table, (anchors, prios, lengths) in zip(tables, plans)
        }


def item_plan(
    meta: Mapping[str, Any], data: Any, table: Table, n: int, path: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(anchors, priorities, lengths)`` of ``table``'s items in the dataset, checked.

    Raises:
        DatasetError: for a table the dataset lacks, another layout, anchors or extents
            that are not one int each per item, extents the layout's items cannot have,
            items reaching outside the steps or anchored on one step twice, priorities
            that are not finite and >= 0, or more items than ``max_size``.
    """
    entry = meta["tables"].get(table.name)
    if entry is None:
        raise DatasetError(
            f"dataset {describe(str(path))} has no items of table {table.name!r}; it holds "
            f"tables {sorted(meta['tables'])}: name the table so, or pass its store to "
            "import the steps only"
        )
    layout = ItemLayout.from_json(entry["layout"], meta["signature"]).to_json()
    if layout != table.layout.to_json():
        raise DatasetError(
            f"table {table.name!r} has layout {table.layout.to_json()}; its items in dataset "
            f"{describe(str(path))} were made with layout {layout}; import into a table "
            "with the dataset's layout"
        )
    prefix = f"tables/{table.name}/"
    anchors, extents, prios = (data[prefix + a] for a in ("anchor", "extent", "priority"))
    where = f"items of table {table.name!r} in dataset {describe(str(path))}"
    damaged = "the file is damaged: export it again"
    one_each = all(a.ndim == 1 and a.dtype.kind in "iu" for a in (anchors, extents))
    if not one_each or len(extents) != len(anchors):
        raise DatasetError(
            f"{where} have anchors {anchors.dtype}{list(anchors.shape)} and extents "
            f"{extents.dtype}{list(extents.shape)}, not one int of each per item; {damaged}"
        )
    if len(anchors) > table.max_size:
        raise DatasetError(
            f"dataset {describe(str(path))} holds {len(anchors)} items of table "
            f"{table.name!r}, more than its max_size={table.max_size}; import into a table "
            "with a larger max_size"
        )
    # Checked here, as create_items would after the steps are appended: an import that
    # fails inserts nothing.
    span, variable = table.layout.span, table.index.extent is not None
    if len(anchors) and (
        (extents.min() < 1 or extents.max() > span) if variable else (extents != span).any()
    ):
        covers = f"between 1 and {span} steps" if variable else f"span={span} steps"
        raise DatasetError(
            f"{where} cover {describe(np.unique(extents).tolist())} steps; items of its "
            f"layout cover {covers}; {damaged}"
        )
    lanes = meta["lanes"]
    if len(anchors) and (anchors.min() < 0 or (anchors + (extents - 1) * lanes).max() >= n):
        raise DatasetError(f"{where} reach outside its {n} steps; {damaged}")
    if len(np.unique(anchors)) != len(anchors):
        raise DatasetError(f"{where} anchor on one step twice; {damaged}")
    try:
        prios = check_priorities(prios, len(anchors), f"tables/{table.name}/priority")
    except InvalidArgumentError as exc:
        raise DatasetError(
            f"dataset {describe(str(path))}: {exc}; the file is damaged: export it again"
        ) from exc
    lengths = extents if table.index.extent is not None else None
    return anchors.astype(np.int64), prios, lengths


def check_signature(meta: Mapping[str, Any], store: StepStore, path: Any) -> None:
    """Refuse a store whose columns differ from the dataset's, naming the first column."""
    theirs: Signature = meta["signature"]
    ours = store.signature
    fix = (
        "build the table with the dataset's signature "
        "(rlreplay.checkpoint.datasets.read_npz_meta(path)['signature'])"
    )
    for field in theirs.paths:
        if field not in ours:
            raise SignatureError(
                f"dataset {describe(str(path))} has column {field!r} "
                f"(shape {theirs[field].shape}, {theirs[field].dtype}), which the table's "
                f"store lacks (its columns: {list(ours.paths)}); {fix}"
            )
        a, b = theirs[field], ours[field]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise SignatureError(
                f"column {field!r} of dataset {describe(str(path))} is shape {a.shape}, "
                f"{a.dtype}; the table's store has shape {b.shape}, {b.dtype}; {fix}"
            )
    extra = [p for p in ours.paths if p not in theirs]
    if extra:
        raise SignatureError(
            f"the table's store has columns {extra} that dataset {describe(str(path))} lacks; {fix}"
        )
    if meta["lanes"] != store.lanes:
        raise DatasetError(
            f"dataset {describe(str(path))} holds steps of a store with lanes={meta['lanes']}; "
            f"the table's store has lanes={store.lanes}; import it into a store with "
            f"lanes={meta['lanes']}"
        )
