"""Datasets out of and into replay: the public names in one place.

* :func:`export_npz` / :func:`import_npz`: any table (or several over one store, or a
  range of a store's steps) as one ``.npz`` of steps, items, keys and priorities, and
  back into tables of the same definition (:mod:`rlreplay.checkpoint.columnar`).
* :func:`export_minari` / :func:`import_minari`: the whole episodes of a store's step
  rows as a Minari dataset, and a Minari dataset into a table of step rows or through
  an adder (:mod:`rlreplay.checkpoint.minari_format`,
  :mod:`rlreplay.checkpoint.minari_import`; the columns are described in
  :mod:`rlreplay.checkpoint.episode_columns`).

A dataset moves experience; a checkpoint (:func:`rlreplay.checkpoint.save`) restores a
table exactly (times sampled, selector order, limiter counters, random generator).
"""

from rlreplay.checkpoint.columnar import export_npz, import_npz, read_npz_meta
from rlreplay.checkpoint.episode_columns import DEFAULT_FIELDS
from rlreplay.checkpoint.minari_format import export_minari
from rlreplay.checkpoint.minari_import import MinariImport, import_minari

__all__ = [
    "DEFAULT_FIELDS",
    "MinariImport",
    "export_minari",
    "export_npz",
    "import_minari",
    "import_npz",
    "read_npz_meta",
]
