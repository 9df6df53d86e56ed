"""Shared-memory segments: POSIX shared memory files a client creates and a server maps.

A segment is a file under ``/dev/shm`` named ``rlreplay-<creator pid>-<16 hex digits>``,
created by a client with mode 0600 (only processes of the same user can map it), a small
header (a magic number and a random nonce) and then its data area. The server that
attaches it checks the name, that it is a regular file of the announced size, and that it
holds the nonce the client announced over the socket (so the server mapped the client's
own file, on the client's own host), and then unlinks it. The client unlinks it too, once
the server answered (attached or not).

The invariant this keeps: **once a segment is unlinked, no crash leaks it.** An unlinked
segment has no name anywhere; its memory belongs to the mappings that remain, and the
kernel frees it when the last of them goes, whichever side is killed (``kill -9``
included). The only window where a name exists is between the client's create and the
server's answer (one round trip); a client killed inside it leaves a file whose creator is
dead, and :func:`sweep_stale` (run when a process creates its first segment) removes
those.
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
# A server drops a connection's segments after this long without use (its client renews
# them sooner).
IDLE_S = 60.0

_swept = False


def available() -> bool:
    """Whether this process can create shared-memory segments (Linux with a writable
    ``/dev/shm``)."""
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
        data: a writable ``uint8`` array over the data area.

    The mapping is released when the last reference to it goes (``data`` and every array
    made from it included), never explicitly: an array still viewing it stays valid.
    """

    def __init__(self, name: str, nbytes: int, nonce: bytes, mm: mmap.mmap):
        self.name, self.nbytes, self.nonce = name, nbytes, nonce
        self._mm = mm
        self.data = self.view()

    def view(self) -> np.ndarray:
        """A new ``uint8`` array over the data area whose base is the mapping itself, so
        that every view made from it has it as its base (numpy collapses chains of views
        down to the first array that does not view another array)."""
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
            # Reserve the pages now: a write to a page a full /dev/shm (a container's
            # 64 MiB, say) cannot provide would kill the writing process with SIGBUS.
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
            ValueError: for a name that is not a segment's, a file that is not a regular
                file of at least the announced size, not owned by this process's user or
                open to other users (its mode is not 600), or a header without the nonce
                (the file is not the client's: another host's ``/dev/shm``, say).
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
            # Only a process of this user may hand this process memory to write into: a
            # file another user owns, or one others may open, could be changed or shrunk
            # under the mapping (a server running as root opens any file).
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
    """Unlink segments left by processes that died between creating a segment and its
    server's answer (their creator pid is gone); returns how many were removed."""
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
    """Checked ``[name, dtype, shape, offset]`` entries that place arrays in a segment's
    data area of ``nbytes`` bytes; each returned with its byte count.

    Raises:
        ProtocolError: for an entry that is malformed, of a dtype that may not cross the
            wire, or that does not fit the data area.
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
