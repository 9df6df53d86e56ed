"""Datasets out of and into replay: experience moved between buffers and tools.

* :func:`export_npz` / :func:`import_npz`: any table (or several over one store, or a
  range of a store's steps) as one ``.npz`` of steps, items, keys and priorities, and
  back into tables of the same definition (:mod:`rlreplay.datasets.npz`).
* :func:`export_minari` / :func:`import_minari`: the whole episodes of a store's step
  rows as a Minari dataset, and a Minari dataset into a table of step rows or through
  an adder (:mod:`rlreplay.datasets.minari`; the columns are described in
  :mod:`rlreplay.datasets.episodes`).

A dataset moves experience; a checkpoint (:func:`rlreplay.checkpoint.save`) restores a
table exactly (times sampled, selector order, limiter counters, random generator).
"""

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
