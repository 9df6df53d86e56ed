"""A server's checkpoint options, checked before it starts and before it restores.

A :class:`~rlreplay.Server` takes ``checkpoint_dir``, ``checkpoint_every_s`` and
``keep_checkpoints`` (see :mod:`rlreplay.net.server.checkpoints`). They are checked when the
server is made (:func:`check_options`: a directory path, a positive period, a count
of at least one, and no period or count without a directory), and the directory once
more when the server starts (:func:`check_writable`: it can be created and written), so
that a server never serves for a while and then fails every checkpoint it takes.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from rlreplay.errors import InvalidArgumentError, describe


def check_options(
    directory: Any, every_s: Any, keep: Any
) -> tuple[Path | None, float | None, int | None]:
    """Validate a server's checkpoint options; returns ``(directory, every_s, keep)`` as
    a path, a float and an int (each ``None`` where not given).

    Raises:
        InvalidArgumentError: for a directory that is not a path (or is a file), a period
            that is not a positive number, a ``keep`` that is not an int >= 1, or a period
            or ``keep`` without a directory.
    """
    if directory is None:
        if every_s is not None or keep is not None:
            raise InvalidArgumentError(
                "checkpoint_every_s and keep_checkpoints need checkpoint_dir= (the directory "
                "the server saves its checkpoints to)"
            )
        return None, None, None
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise InvalidArgumentError(
            f"checkpoint_dir={describe(directory)} must be a directory path (str or PathLike)"
        )
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise InvalidArgumentError(
            f"checkpoint_dir={str(root)!r} is a file; give a directory to hold checkpoints"
        )
    if every_s is not None and (
        not isinstance(every_s, (int, float))
        or isinstance(every_s, bool)
        or not math.isfinite(every_s)
        or every_s <= 0
    ):
        raise InvalidArgumentError(
            f"checkpoint_every_s={describe(every_s)} must be a number of seconds > 0, or None "
            "to checkpoint only when a client asks"
        )
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise InvalidArgumentError(
            f"keep_checkpoints={describe(keep)} must be an int >= 1 (the newest checkpoints "
            "kept), or None to keep them all"
        )
    return root, None if every_s is None else float(every_s), keep


def check_writable(directory: Path) -> None:
    """Create the checkpoint ``directory`` if needed and check that this process may
    write there, so that a server never starts whose every checkpoint would fail.

    Raises:
        InvalidArgumentError: naming the directory and the operating system's reason.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(
            f"checkpoint_dir={str(directory)!r} cannot be created ({exc.strerror}); "
            "give a directory this process can create or write"
        ) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidArgumentError(
            f"checkpoint_dir={str(directory)!r} is not writable by this process; "
            "give a directory it can write"
        )
