"""Checkpoints of tables and their stores: every part's state, in a pickle-free format.

Save and restore::

    path = rlreplay.checkpoint.save(table, "ckpts", keep=3)   # ckpts/ckpt-00000001/
    table = rlreplay.checkpoint.restore("ckpts")["replay"]    # the newest valid one there

    # several tables over one store (or over several stores)
    rlreplay.checkpoint.save([prioritized, queue], "ckpts", keep=3)
    tables = rlreplay.checkpoint.restore("ckpts")   # {"name": Table, ...}, stores shared

    # into tables you built, checking their definitions against the checkpoint's
    rlreplay.checkpoint.restore("ckpts", [prioritized, queue], adapt=False)

    # in the background; serving goes on meanwhile
    pending = rlreplay.checkpoint.start_save(tables, "ckpts", keep=3)
    path = pending.result(timeout=60)

What is saved: the step columns and the store's next id; per table its item index (per
slot priority, generation, times sampled, live flag, extent; size, counters, generation
origin), both selectors' exact states, the rate limiter's counters and the random
generator's state. After a restore the same calls give the same results as without the
save. Writers open during a save: their steps and items up to the checkpoint's moment are
saved, the writers themselves are not (see ``docs/checkpoints.md``).

Format: a directory per checkpoint holding ``.npy`` files (each per-item array, each
chunk of each step column) and ``manifest.json`` (format version, definitions, per-file
sizes and crc32 checksums; see :mod:`rlreplay.checkpoint.manifest`), written beside and
published by one atomic rename.
Restore refuses, with a :class:`~rlreplay.errors.CheckpointError` subclass saying why and
what to do, another format version, a damaged checkpoint given by name (in a directory
of checkpoints damaged ones are skipped with a warning), and tables whose definitions
differ, unless ``adapt=True`` and the difference can be adapted.

Datasets (:mod:`rlreplay.datasets`) move experience instead: ``export_npz`` /
``import_npz`` (any table, one ``.npz``) and ``export_minari`` / ``import_minari`` (whole
episodes, the Minari format); see docs/checkpoints.md, "Datasets".

Serving goes on while a checkpoint is written: the store's lock is held to copy the small
per-item state, then for one chunk copy at a time while the columns stream to disk; rows
that writes would change before they are streamed are copied aside first. Chunks no write
changed since the newest checkpoint in the same directory are hard links to its files
(:mod:`rlreplay.checkpoint.increments`).
"""

from rlreplay.checkpoint.manifest import FORMAT_VERSION
from rlreplay.checkpoint.restore import restore
from rlreplay.checkpoint.retention import published as list_checkpoints
from rlreplay.checkpoint.save import PendingSave, SaveStats, save, start_save

__all__ = [
    "FORMAT_VERSION",
    "PendingSave",
    "SaveStats",
    "list_checkpoints",
    "restore",
    "save",
    "start_save",
]
