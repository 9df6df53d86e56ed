"""Reverb's checkpointers: where a server saves (and restores) its checkpoints."""

from __future__ import annotations

import os
import tempfile

__all__ = [
    "CheckpointerBase",
    "DefaultCheckpointer",
    "RecordIOCheckpointer",
    "default_checkpointer",
]


class CheckpointerBase:
    """A checkpoint directory (``path``)."""

    def __init__(self, path: str | os.PathLike, group: str = ""):
        self.path = os.fspath(path)
        self.group = group

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={self.path!r})"


class DefaultCheckpointer(CheckpointerBase):
    """Checkpoints in ``path`` (rlreplay's checkpoint format, not Reverb's)."""


RecordIOCheckpointer = DefaultCheckpointer


def default_checkpointer() -> DefaultCheckpointer:
    """A checkpointer in a new temporary directory, as Reverb's default is."""
    return DefaultCheckpointer(tempfile.mkdtemp(prefix="rlreplay_reverb_checkpoints_"))
