"""A plain columnar dataset of any table: one ``.npz`` file of steps, items and priorities.

Unlike a checkpoint (which restores every part's state exactly), a columnar dataset is
for moving experience between buffers and tools: any numpy user can read it with
``np.load(path, allow_pickle=False)``, and :func:`import_npz` pre-fills tables with the
same definition from it. :func:`export_npz` (here) writes one, a consistent snapshot of
one moment while writers and samplers go on; what the file holds is described in
:mod:`rlreplay.checkpoint.columnar_format` (with :func:`read_npz_meta`), and the import
is :mod:`rlreplay.checkpoint.columnar_import`'s.

Imported items get new keys (returned, aligned with the file's ``key`` arrays) and start
with ``times_sampled`` 0; their priorities are kept (a table that keeps no priorities,
uniform and FIFO/LIFO, exports 1.0 for each). Parquet is not offered: it would
add pyarrow, which nothing else here needs.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.checkpoint.columnar_format import FORMAT, VERSION, read_npz_meta, store_and_tables
from rlreplay.checkpoint.columnar_import import import_npz
from rlreplay.checkpoint.table_contents import item_data as gather_items
from rlreplay.checkpoint.table_contents import read_items, read_steps
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, describe

__all__ = ["FORMAT", "VERSION", "export_npz", "import_npz", "read_npz_meta"]


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
    (see :func:`~rlreplay.checkpoint.table_contents.read_steps`).

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
            f"path={describe(path)} must be the path of the .npz file to write (str or "
            "os.PathLike)"
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
