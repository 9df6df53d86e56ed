"""One array mapped from several files: a column whose chunks are separate files.

A memory-mapped restore serves a store's columns straight from the checkpoint's files.
A column written in chunks (see :mod:`~rlreplay.checkpoint.streaming`) is one array to
the store, so its files are mapped side by side into one reserved address range: an
anonymous reservation of the whole column, then each chunk file's data mapped over its
part (``MAP_FIXED``), copy-on-write (``MAP_PRIVATE``: writes change memory, never the
files). That needs each file's data to start on a page and every chunk but the last to
be whole pages, as a save writes them; where that or the platform (Linux here) does not
allow it, :func:`map_parts` returns ``None`` and the caller reads the files instead.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

import numpy as np

_MAP_FIXED = 0x10  # Linux
_PAGE = mmap.PAGESIZE
_FAILED = ctypes.c_void_p(-1).value
_libc = None


def _lib():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int64,
        ]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = libc
    return _libc


class _Mapping:
    """Owns one reserved range (unmapped when the last array over it goes) and
    exposes it to numpy as an array of ``shape`` and ``dtype``."""

    def __init__(self, address: int, size: int, shape: tuple[int, ...], dtype: np.dtype):
        self.address, self.size = address, size
        self.__array_interface__ = {
            "shape": shape,
            "typestr": dtype.str,
            "descr": dtype.descr,
            "data": (address, False),
            "version": 3,
        }

    def __del__(self) -> None:
        if self.address:
            _lib().munmap(self.address, self.size)
            self.address = 0


def map_parts(
    parts: list[tuple[Path, int, int]], shape: tuple[int, ...], dtype: np.dtype
) -> np.ndarray | None:
    """An array of ``shape`` and ``dtype`` whose bytes are, in order, ``nbytes`` of each
    ``(path, offset, nbytes)``, mapped copy-on-write; ``None`` where the parts cannot
    be mapped side by side (then read them).

    Raises:
        OSError: if a file cannot be opened or mapped.
    """
    total = sum(n for _, _, n in parts)
    if (
        not sys.platform.startswith("linux")
        or ctypes.sizeof(ctypes.c_void_p) != 8
        or total == 0
        or total != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        or any(off % _PAGE for _, off, _ in parts)
        or any(n % _PAGE for _, _, n in parts[:-1])
    ):
        return None
    libc = _lib()
    size = -(-total // _PAGE) * _PAGE
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    address = libc.mmap(None, size, 0, flags, -1, 0)  # PROT_NONE: reserved only
    if address in (None, _FAILED):
        raise OSError(ctypes.get_errno(), "cannot reserve the address range of a column")
    owner = _Mapping(address, size, shape, dtype)
    at = 0
    for path, offset, n in parts:
        fd = os.open(path, os.O_RDONLY)
        try:
            got = libc.mmap(
                address + at,
                n,
                mmap.PROT_READ | mmap.PROT_WRITE,
                mmap.MAP_PRIVATE | _MAP_FIXED,
                fd,
                offset,
            )
        finally:
            os.close(fd)
        if got != address + at:
            err = ctypes.get_errno()
            del owner
            raise OSError(err, f"cannot map {path}: {os.strerror(err)}")
        at += n
    arr = np.asarray(owner)
    return arr
