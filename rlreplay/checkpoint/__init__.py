"""Checkpoints of tables and their stores: every part's state, in a pickle-free format.

Save and restore::

    path = rlreplay.checkpoint.save(table, "ckpts", keep=3)   # ckpts/ckpt-00000001/
    table = rlreplay.checkpoint.restore("ckpts")["replay"]    # the newest valid one there
    pending = rlreplay.checkpoint.start_save(tables, "ckpts", keep=3)  # in the background
    path = pending.result(timeout=60)

A checkpoint is published by one atomic rename; restore checks format version, checksums
and definitions. See docs/checkpoints.md.
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
