"""A plain columnar dataset of any table: one ``.npz`` file of steps, items and priorities.

Readable with ``np.load(path, allow_pickle=False)``: ``meta`` (JSON), ``steps/<field>``
and per table ``tables/<name>/{anchor,extent,key,priority,times_sampled}``. A failed
import inserts nothing. See docs/checkpoints.md.
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
        InvalidArgumentError: for anything else, several stores, or two tables of one name.
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
        DatasetError: if it cannot be read, or is not an ``.npz`` archive.
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
    """The checked ``meta`` record of an opened dataset.

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

    The file is a consistent snapshot of one moment while writers and samplers go on.

    Args:
        source: a :class:`Table`, tables over one store, or a :class:`StepStore` (steps
            only).
        path: the file to write (``.npz`` appended when missing); renamed into place, so a
            reader never sees half a file.
        first_id: the first step id (insert count) to export; default every stored step.
            Items are exported when all their steps lie in ``[first_id, end_id)``.
        end_id: the step id the exported range ends before.
        item_data: also write each item's layout outputs (``tables/<name>/data/...``).

    Returns:
        The path written.

    Raises:
        InvalidArgumentError: for a bad ``source``, range or ``path`` (nothing is read).
    """
    store, tables = store_and_tables(source, "source")
    path = _output_path(path)
    arrays: dict[str, np.ndarray] = {}
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
    """The ``.npz`` file ``export_npz`` writes for ``path``, checked before any step is read."""
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
    """Pre-fill tables from a columnar dataset, with the dataset's priorities.

    Everything is checked before anything is inserted; an import never waits, and a failed
    import inserts nothing.

    Args:
        path: a file written by :func:`export_npz`.
        target: a :class:`Table`, tables over one store (each in the dataset, by name), or
            a :class:`StepStore` (steps only).

    Returns:
        Table name to the int64 keys of its new items, aligned with ``tables/<name>/key``.

    Raises:
        DatasetError: for a file that is not a columnar dataset, a table missing or of
            another layout, data that does not fit, or an import that would wait.
        SignatureError: if the store's columns differ from the dataset's.
        InvalidArgumentError: if the store cannot hold what writers retain plus the steps.
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
        DatasetError: for a missing table, another layout, malformed items, or too many.
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
    # Checked before the steps are appended, so a failed import inserts nothing.
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
