"""Where checkpoints live in their directory, which is newest, and keeping the last K.

Checkpoints are ``ckpt-<sequence>``, published by an atomic rename; pruning renames to
``.del-...`` before deleting, so a half-deleted one is never taken for a checkpoint.
"""

from __future__ import annotations

import operator
import os
import re
import shutil
import weakref
from pathlib import Path

from rlreplay.errors import InvalidArgumentError, describe

try:
    import fcntl
except ImportError:  # not POSIX: nothing is held, the pid decides
    fcntl = None  # type: ignore[assignment]

PREFIX = "ckpt-"
_NAME = re.compile(r"^ckpt-(\d{8,})$")
_TEMP = re.compile(r"^\.tmp-ckpt-\d+-(\d+)-[0-9a-f]+$")
_TRASH = re.compile(r"^\.del-.+-(\d+)$")  # a deletion under way: .del-<name>-<pid>


def check_keep(keep: object) -> int | None:
    """Validate ``keep`` (an int >= 1, or ``None`` to keep every checkpoint).

    Raises:
        InvalidArgumentError: for anything else.
    """
    if keep is None:
        return None
    try:  # any integer (numpy's too), but not a bool
        count = None if isinstance(keep, bool) else operator.index(keep)  # type: ignore[arg-type]
    except TypeError:
        count = None
    if count is None or count < 1:
        raise InvalidArgumentError(
            f"keep={describe(keep)} must be an int >= 1 (how many of the newest checkpoints "
            "to keep) or None to keep them all"
        )
    return count


def name_of(sequence: int) -> str:
    return f"{PREFIX}{sequence:08d}"


def sequence_of(path: Path) -> int | None:
    """The sequence number of a published checkpoint's directory, else ``None``."""
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


def published(root: str | os.PathLike) -> list[Path]:
    """The published checkpoint directories under ``root``, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(sequence_of(p), p) for p in root.iterdir() if p.is_dir()]
    return [p for seq, p in sorted((f for f in found if f[0] is not None), reverse=True)]


def next_sequence(root: Path) -> int:
    """One more than the newest sequence number under ``root`` (temporary ones included)."""
    top = 0
    for p in root.iterdir():
        seq = sequence_of(p)
        if seq is None and p.name.startswith(".tmp-" + PREFIX):
            digits = p.name[len(".tmp-" + PREFIX) :].split("-", 1)[0]
            seq = int(digits) if digits.isdigit() else None
        if seq is not None:
            top = max(top, seq)
    return top + 1


class DirectoryHold:
    """An exclusive ``flock`` on a save's temporary directory, so :func:`prune` spares it
    (a pid alone cannot tell: a saver in another pid namespace may share the directory).

    Args:
        path: the directory, just made by this save.
    """

    def __init__(self, path: Path):
        self.fd: int | None = None
        if fcntl is None:
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        self.fd = fd
        self._closer = weakref.finalize(self, os.close, fd)

    def release(self) -> None:
        """Let go of the directory (published, deleted or given up)."""
        if self.fd is not None:
            self.fd = None
            self._closer()


def _held(path: Path) -> bool:
    """Whether a live save holds ``path``; ``False`` where that cannot be told."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing lets go of a lock taken here
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prune(root: Path, keep: int | None) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints and dead processes' leftovers; the deleted."""
    doomed = published(root)[keep:] if keep is not None else []
    trashed = []
    for p in list(root.iterdir()):
        temp, trash = _TEMP.match(p.name), _TRASH.match(p.name)
        pid = int((temp or trash).group(1)) if temp or trash else None
        if pid is None or pid == os.getpid() or _alive(pid) or (temp and _held(p)):
            continue
        (doomed if temp else trashed).append(p)
    for p in doomed:
        trash = p.with_name(f".del-{p.name.lstrip('.')}-{os.getpid()}")
        try:
            os.rename(p, trash)
        except OSError:
            continue  # someone else is deleting it
        shutil.rmtree(trash, ignore_errors=True)
    for p in trashed:  # already renamed away (never taken for a checkpoint): finish it
        shutil.rmtree(p, ignore_errors=True)
    return doomed + trashed


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a new file, a rename) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
