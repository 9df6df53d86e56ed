"""Shared-memory segments: POSIX shared memory files a client creates and a server maps.

A segment is a mode-0600 file under ``/dev/shm`` with a header holding a random nonce; the
server checks the nonce (so it maps the client's own file) and both sides unlink it once
mapped. Invariant: once unlinked, no crash leaks it; files of clients killed before that
are removed by :func:`sweep_stale`. See docs/shared_memory.md.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import stat
import sys
from typing import Any

import numpy as np

from rlreplay.errors import ProtocolError, describe

SHM_DIR = "/dev/shm"
PREFIX = "rlreplay-"
NAME_RE = re.compile(r"rlreplay-(\d{1,10})-[0-9a-f]{16}")
MAGIC = b"RLRSHM01"
NONCE_BYTES = 16
HEADER_BYTES = 64  # magic, nonce, padding: the data area starts 64-byte aligned
MAX_SEGMENT_BYTES = 1 << 40
# A server drops a connection's segments after this long unused.
IDLE_S = 60.0

_swept = False


def available() -> bool:
    """Whether this process can create segments (Linux with a writable ``/dev/shm``)."""
    return sys.platform.startswith("linux") and os.access(SHM_DIR, os.W_OK | os.X_OK)


def boot_id() -> str:
    """This host's boot id (equal for processes of one running kernel), or ``""``."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


class Segment:
    """One mapping of a shared-memory segment.

    Attributes:
        name: the file's name under ``/dev/shm`` (gone once unlinked).
        nbytes: bytes of the data area.
        nonce: the random bytes in its header.
        data: a writable ``uint8`` array over the data area (the mapping lives as long).
    """

    def __init__(self, name: str, nbytes: int, nonce: bytes, mm: mmap.mmap):
        self.name, self.nbytes, self.nonce = name, nbytes, nonce
        self._mm = mm
        self.data = self.view()

    def view(self) -> np.ndarray:
        """A ``uint8`` array over the data area whose base is the mapping itself: numpy collapses
        view chains, so every view has this mapping as ``.base``, which slot release relies on."""
        return np.frombuffer(self._mm, np.uint8, count=self.nbytes, offset=HEADER_BYTES)

    @classmethod
    def create(cls, nbytes: int) -> Segment:
        """A new segment with a data area of ``nbytes`` (still named: :meth:`unlink` it
        once the server answered).

        Raises:
            OSError: if the file cannot be created or its memory reserved (``/dev/shm``
                full: ENOSPC).
        """
        global _swept
        if not _swept:
            _swept = True
            sweep_stale()
        nonce = secrets.token_bytes(NONCE_BYTES)
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        fd = os.open(_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, HEADER_BYTES + nbytes)
            # reserve the pages now: writing a page a full /dev/shm cannot give is SIGBUS
            os.posix_fallocate(fd, 0, HEADER_BYTES + nbytes)
            mm = mmap.mmap(fd, HEADER_BYTES + nbytes)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(_path(name))
            raise
        os.close(fd)
        mm[: len(MAGIC) + NONCE_BYTES] = MAGIC + nonce
        return cls(name, nbytes, nonce, mm)

    @classmethod
    def attach(cls, name: str, nbytes: int, nonce: bytes) -> Segment:
        """Map the segment a client created and unlink its name.

        Raises:
            ValueError: for a bad name, a file not regular, too small, not this user's or
                open to others, or a header without the nonce.
            OSError: if the file cannot be opened or mapped (another user's, say).
        """
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ValueError(f"{name!r} is not a shared-memory segment name")
        fd = os.open(_path(name), os.O_RDWR | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size < HEADER_BYTES + nbytes:
                raise ValueError(
                    f"segment {name!r} holds {st.st_size} bytes, not the "
                    f"{HEADER_BYTES + nbytes} announced"
                )
            # only this user's private file may be mapped for writing (root opens any)
            if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise ValueError(
                    f"segment {name!r} is owned by uid {st.st_uid} with mode "
                    f"{stat.S_IMODE(st.st_mode):o}, not by uid {os.geteuid()} with mode 600"
                )
            mm = mmap.mmap(fd, HEADER_BYTES + nbytes)
        finally:
            os.close(fd)
        if mm[: len(MAGIC) + NONCE_BYTES] != MAGIC + nonce:
            raise ValueError(f"segment {name!r} does not hold the nonce its client announced")
        segment = cls(name, nbytes, nonce, mm)
        segment.unlink()
        return segment

    def unlink(self) -> None:
        """Remove the segment's name (its memory stays while it is mapped)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_path(self.name))


def sweep_stale() -> int:
    """Unlink segments whose creator died before its server answered; returns how many."""
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        match = NAME_RE.fullmatch(name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
            continue  # alive (or pid reused: left alone)
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        with contextlib.suppress(OSError):
            os.unlink(_path(name))
            removed += 1
    return removed


ALIGN = 64  # arrays in a segment start at multiples of this many bytes


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-nbytes // ALIGN) * ALIGN


def check_entries(entries: Any, nbytes: int) -> list[tuple[str, np.dtype, tuple, int, int]]:
    """Checked ``[name, dtype, shape, offset]`` entries placing arrays in a data area of
    ``nbytes`` bytes, each returned with its byte count.

    Raises:
        ProtocolError: for an entry that is malformed, of a disallowed dtype, or that does
            not fit the data area.
    """
    from rlreplay.net.wire import codec

    if not isinstance(entries, list) or len(entries) > 4096:
        raise ProtocolError(f"shared-memory entries {describe(entries)} are not a list")
    out = []
    for entry in entries:
        try:
            name, dtype_str, shape, off = entry
            dtype = codec.dtype_of(dtype_str)
            if not isinstance(name, str) or dtype is None or type(off) is not int:
                raise ValueError(entry)
            size = codec.array_extent(shape, dtype.itemsize)[1]
            shape = tuple(shape)
            if off < 0 or off + size > nbytes or off % dtype.alignment:
                raise ValueError(entry)
        except (TypeError, ValueError):
            raise ProtocolError(f"malformed shared-memory entry {describe(entry)}") from None
        out.append((name, dtype, shape, off, size))
    return out
