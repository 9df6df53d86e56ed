"""Datasets out of and into replay: ``.npz`` for any table, Minari for whole episodes."""

from rlreplay.datasets.episodes import DEFAULT_FIELDS
from rlreplay.datasets.minari import MinariImport, export_minari, import_minari
from rlreplay.datasets.npz import export_npz, import_npz, read_npz_meta

__all__ = [
    "DEFAULT_FIELDS",
    "MinariImport",
    "export_minari",
    "export_npz",
    "import_minari",
    "import_npz",
    "read_npz_meta",
]
