"""Incremental checkpoints: reusing the previous checkpoint's files of unchanged chunks.

Unchanged chunks are hard-linked (or copied) from the newest checkpoint; each checkpoint
stays complete on its own, and published files are never written again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.checkpoint import retention
from rlreplay.checkpoint.manifest import read_manifest
from rlreplay.core.storage import StepStore
from rlreplay.errors import CheckpointError


@dataclass(frozen=True)
class Previous:
    """One store as the newest checkpoint of a directory holds it."""

    directory: Path
    generation: int
    chunk_rows: int
    capacity: int
    columns: dict[str, list[str]]  # field path to its chunk files' names
    files: Mapping[str, Any]  # the manifest's file entries

    def reusable(self, store: StepStore) -> np.ndarray:
        """The chunks of ``store`` unchanged since this checkpoint (lock held, chunks stamped)."""
        if (
            self.chunk_rows != store.chunk_rows
            or self.capacity != store.capacity
            or list(self.columns) != list(store.columns)
            or any(len(v) != len(store.chunk_generations) for v in self.columns.values())
        ):
            return np.zeros(0, np.int64)
        return np.flatnonzero(store.chunk_generations <= self.generation)


def previous_stores(root: Path) -> dict[str, Previous]:
    """The stores of the newest readable checkpoint under ``root``, by identity (else empty)."""
    newest = retention.published(root)[:1]
    if not newest:
        return {}
    try:
        manifest = read_manifest(newest[0])
    except (CheckpointError, OSError):
        return {}
    out = {}
    for s in manifest["stores"]:
        try:
            inc = s["increments"]
            columns = {p: list(names) for p, names in s["columns"].items()}
            if not all(isinstance(n, str) for v in columns.values() for n in v):
                continue
            out[str(inc["store"])] = Previous(
                newest[0],
                int(inc["generation"]),
                int(s["chunk_rows"]),
                int(s["capacity"]),
                columns,
                manifest["files"],
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # a version 1 checkpoint, or an entry not understood: write all
    return out


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a new name of ``source``'s data, or a copy where links fail."""
    try:
        os.link(source, target)
        return
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
            raise
    shutil.copyfile(source, target)
    with open(target, "rb") as f:
        os.fsync(f.fileno())


def reuse(
    previous: Previous, chunks: np.ndarray, files: dict[str, list[Path]]
) -> tuple[list[int], dict[Path, dict], int]:
    """Link (or copy) the files of ``chunks`` from ``previous`` to ``files``.

    Returns:
        The chunks reused, their files' manifest entries by path, and their bytes (chunks
        whose previous files are missing or differ are left out).
    """
    done: list[int] = []
    entries: dict[Path, dict] = {}
    nbytes = 0
    for c in chunks.tolist():
        made: dict[Path, dict] = {}
        try:
            for path, names in previous.columns.items():
                name = names[c]
                info = previous.files[name]
                source = previous.directory / name
                if source.stat().st_size != info["bytes"]:
                    raise FileNotFoundError(source)
                target = files[path][c]
                _link_or_copy(source, target)
                made[target] = dict(info)
        except (FileNotFoundError, KeyError, TypeError):
            for target in made:
                with contextlib.suppress(OSError):
                    target.unlink()
            continue
        done.append(c)
        entries.update(made)
        nbytes += sum(int(e["bytes"]) for e in made.values())
    return done, entries, nbytes
