"""A plain columnar dataset of any table: one ``.npz`` file of steps, items and priorities.

Unlike a checkpoint (which restores every part's state exactly), a columnar dataset is
for moving experience between buffers and tools: any numpy user can read it with
``np.load(path, allow_pickle=False)``, and :func:`import_npz` pre-fills tables with the
same definition from it. :func:`export_npz` writes one, a consistent snapshot of one
moment while writers and samplers go on. For a range of one store's steps it holds:

* ``meta``: a JSON string (format name and version, the signature, lanes, the step
  range, and per table its layout and which arrays it has; :func:`read_npz_meta`);
* ``steps/<field path>``: the stored steps in step-id order, ``[n, *shape]``;
* ``tables/<name>/anchor`` (int64, the item's anchor as a step index into ``steps``),
  ``extent`` (steps each item covers), ``key`` (the key the table issued), ``priority``
  (float64) and ``times_sampled`` (uint32), one entry per item whose steps all lie in the
  range, oldest anchor first;
* with ``item_data=True``, ``tables/<name>/data/<output field>``: each item's layout
  outputs, what sampling it returns (e.g. ``obs`` and ``next_obs`` of a transition).

An import checks everything before it inserts anything (the file, the store's columns
and lanes, each table's layout, sizes and whether the store and the rate limiters admit
the whole import now), so a failed import inserts nothing. Imported items get new keys
(returned, aligned with the file's ``key`` arrays) and start with ``times_sampled`` 0;
their priorities are kept (a table that keeps no priorities, uniform and FIFO/LIFO,
exports 1.0 for each). Parquet is not offered: it would add pyarrow, which nothing else
here needs.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.layout import ItemLayout
from rlreplay.core.specs import Signature
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.datasets.table_contents import item_data as gather_items
from rlreplay.datasets.table_contents import read_items, read_steps
from rlreplay.errors import DatasetError, InvalidArgumentError, SignatureError, describe

FORMAT = "rlreplay-columnar"
VERSION = 1


def store_and_tables(source: Any, argument: str) -> tuple[StepStore, list[Table]]:
    """``(store, tables)`` of a table, a list of tables over one store, or a store.

    Raises:
        InvalidArgumentError: for anything else, tables over different stores, or two
            tables of one name.
    """
    if isinstance(source, StepStore):
        return source, []
    tables = [source] if isinstance(source, Table) else source
    if (
        not isinstance(tables, Sequence)
        or not tables
        or not all(isinstance(t, Table) for t in tables)
    ):
        raise InvalidArgumentError(
            f"{argument}={describe(source)} must be a Table, a non-empty list of Tables over "
            "one StepStore, or a StepStore (steps only)"
        )
    store = tables[0].store
    if any(t.store is not store for t in tables):
        raise InvalidArgumentError(
            f"{argument} holds tables over different stores "
            f"({[t.name for t in tables]}); give tables that share one StepStore"
        )
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"{argument} names a table twice: {names}")
    return store, list(tables)


def read_npz_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The ``meta`` record of a columnar dataset (``signature`` as a :class:`Signature`).

    Raises:
        DatasetError: if the file is not an rlreplay columnar dataset of a known version.
    """
    with open_dataset(path) as data:
        return dataset_meta(data, path)


ZIP_MAGIC = b"PK\x03\x04"  # an .npz file is a zip archive


def open_dataset(path: str | os.PathLike):
    """The ``.npz`` archive at ``path``, opened without pickle.

    Raises:
        DatasetError: if it cannot be read, or is not an ``.npz`` archive (looked at
            before numpy, whose advice for other files is to allow pickle).
    """
    advice = "give a file written by rlreplay.datasets.export_npz"
    try:
        with open(path, "rb") as f:
            magic = f.read(len(ZIP_MAGIC))
    except OSError as exc:
        raise DatasetError(f"path={describe(str(path))} cannot be read ({exc}); {advice}") from exc
    if magic != ZIP_MAGIC:
        raise DatasetError(
            f"path={describe(str(path))} is not an .npz archive (it starts with {magic!r}, "
            f"not a zip header); {advice}"
        )
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, TypeError) as exc:
        raise DatasetError(
            f"path={describe(str(path))} cannot be read as an .npz file ({exc}); {advice}"
        ) from exc


def dataset_meta(data: Any, path: Any) -> dict[str, Any]:
    """The checked ``meta`` record of an opened dataset (``signature`` as a
    :class:`Signature`).

    Raises:
        DatasetError: if it is not an rlreplay columnar dataset of a known version.
    """
    try:
        meta = json.loads(str(data["meta"]))
        ok = meta.get("format") == FORMAT
    except (KeyError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise DatasetError(
            f"{describe(str(path))} is not an rlreplay columnar dataset (no valid 'meta' "
            f"entry naming format {FORMAT!r}); give a file written by export_npz"
        )
    if meta.get("version") != VERSION:
        raise DatasetError(
            f"{describe(str(path))} has format version {meta.get('version')!r}; this rlreplay "
            f"reads version {VERSION}: export it again with a matching rlreplay"
        )
    meta["signature"] = Signature.from_json(meta["signature"])
    return meta


def export_npz(
    source: Table | Sequence[Table] | StepStore,
    path: str | os.PathLike,
    *,
    first_id: int | None = None,
    end_id: int | None = None,
    item_data: bool = False,
) -> Path:
    """Write a table's (or several tables') stored steps and items to one ``.npz`` file.

    The file is a consistent snapshot of one moment while writers and samplers go on:
    the items' per-item state is read in one lock hold, the steps a chunk per lock hold
    (see :func:`~rlreplay.datasets.table_contents.read_steps`).

    Args:
        source: a :class:`Table`, tables over one store, or a :class:`StepStore` (steps
            only).
        path: the file to write (``.npz`` is appended when missing); it is
            written beside and renamed into place, so a reader never sees half a file.
        first_id: the first step id (insert count) to export, with ``end_id`` the range
            ``[first_id, end_id)``; default every stored step. Items are exported when
            all their steps lie in the range.
        end_id: the step id (insert count) the exported range ends before.
        item_data: also write each item's layout outputs (``tables/<name>/data/...``).

    Returns:
        The path written.

    Raises:
        InvalidArgumentError: for a bad ``source``, range or ``path`` (not a path, a
            folder that does not exist, or a directory in the way); nothing is read then.
    """
    store, tables = store_and_tables(source, "source")
    path = _output_path(path)
    arrays: dict[str, np.ndarray] = {}
    # The items and the steps from one moment (the steps a chunk per lock hold).
    span, steps, records = read_steps(
        store,
        first_id,
        end_id,
        first_hold=lambda span: {t.name: read_items(t, span) for t in tables},
    )
    meta: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "signature": store.signature.to_json(),
        "lanes": store.lanes,
        "first_id": span.first_id,
        "end_id": span.end_id,
        "tables": {},
    }
    for field, column in steps.items():
        arrays[f"steps/{field}"] = column
    for table in tables:
        items = records[table.name]
        prefix = f"tables/{table.name}/"
        arrays[prefix + "anchor"] = items.anchor_ids - span.first_id
        arrays[prefix + "extent"] = items.extents
        arrays[prefix + "key"] = items.keys
        arrays[prefix + "priority"] = items.priorities
        arrays[prefix + "times_sampled"] = items.times_sampled
        data = {}
        if item_data:
            data = gather_items(table.layout, steps, store.lanes, items, span.first_id)
        for name, values in data.items():
            arrays[f"{prefix}data/{name}"] = values
        meta["tables"][table.name] = {
            "layout": table.layout.to_json(),
            "items": len(items.keys),
            "item_data": sorted(data),
        }
    arrays["meta"] = np.array(json.dumps(meta))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _output_path(path: Any) -> Path:
    """The ``.npz`` file ``export_npz`` writes for ``path``, checked before any step is read.

    Raises:
        InvalidArgumentError: if ``path`` is not a path, its folder does not exist, or a
            directory has its name.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise InvalidArgumentError(
            f"path={describe(path)} must be the path of the .npz file to write (str or os.PathLike)"
        )
    out = Path(path)
    if out.suffix != ".npz":
        out = out.with_name(out.name + ".npz")
    if not out.parent.is_dir():
        raise InvalidArgumentError(
            f"path={describe(os.fspath(path))}: the folder {describe(str(out.parent))} does "
            "not exist; create it first or give a path in an existing folder"
        )
    if out.is_dir():
        raise InvalidArgumentError(
            f"path={describe(os.fspath(path))}: {describe(str(out))} is a directory; give "
            "the path of a file to write"
        )
    return out


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
    table.index.check_priority_range(prios, f"dataset tables/{table.name}/priority")
    lengths = extents if table.index.extent is not None else None
    return anchors.astype(np.int64), prios, lengths


def check_signature(meta: Mapping[str, Any], store: StepStore, path: Any) -> None:
    """Refuse a store whose columns differ from the dataset's, naming the first column."""
    theirs: Signature = meta["signature"]
    ours = store.signature
    fix = (
        "build the table with the dataset's signature "
        "(rlreplay.datasets.read_npz_meta(path)['signature'])"
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
