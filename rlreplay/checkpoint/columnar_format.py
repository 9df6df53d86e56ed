"""The columnar dataset format: what one ``.npz`` file holds, and reading its ``meta``.

A columnar dataset (written by :func:`~rlreplay.checkpoint.columnar.export_npz`, read
back by :func:`~rlreplay.checkpoint.columnar_import.import_npz`) is one ``.npz`` file
that any numpy user can read with ``np.load(path, allow_pickle=False)``. It holds, for a
range of one store's steps:

* ``meta``: a JSON string (format name and version, the signature, lanes, the step
  range, and per table its layout and which arrays it has);
* ``steps/<field path>``: the stored steps in step-id order, ``[n, *shape]``;
* ``tables/<name>/anchor`` (int64, the item's anchor as a step index into ``steps``),
  ``extent`` (steps each item covers), ``key`` (the key the table issued), ``priority``
  (float64) and ``times_sampled`` (uint32), one entry per item whose steps all lie in the
  range, oldest anchor first;
* with ``item_data=True``, ``tables/<name>/data/<output field>``: each item's layout
  outputs, what sampling it returns (e.g. ``obs`` and ``next_obs`` of a transition).

This module names the format (:data:`FORMAT`, :data:`VERSION`), opens a file without
pickle and checks its ``meta`` (:func:`read_npz_meta`), and checks what a dataset is
exported from or imported into (:func:`store_and_tables`: tables over one store, or the
store alone), for both directions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlreplay.core.specs import Signature
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import DatasetError, InvalidArgumentError, describe

FORMAT = "rlreplay-columnar"
VERSION = 1

ITEM_ARRAYS = ("anchor", "extent", "key", "priority", "times_sampled")


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
    advice = "give a file written by rlreplay.checkpoint.export_npz"
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
