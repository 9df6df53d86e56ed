"""Reading a checkpoint: choosing it, checking it, loading its arrays.

Checksums are checked as files are read; memory-mapped columns are mapped copy-on-write,
or read where mapping is impossible. Nothing here changes a table.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import warnings
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.checkpoint import retention
from rlreplay.checkpoint.manifest import (
    MANIFEST,
    check_files,
    check_npy_header,
    map_array,
    npy_layout,
    read_header,
    read_manifest,
    unflatten_state,
)
from rlreplay.checkpoint.progress import Progress
from rlreplay.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    InvalidArgumentError,
    describe,
)

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
    """Owns one reserved range, exposed to numpy as an array; unmapped when the last view goes."""

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
    """An array of the ``(path, offset, nbytes)`` parts mapped copy-on-write, or ``None``.

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


READ_BYTES = 64 << 20  # a column file is read this many bytes at a time


def _chain_crc(data: memoryview, before: Future) -> int:
    return zlib.crc32(data, before.result())


def read_array(directory: Path, name: str, info: Mapping[str, Any], progress=None) -> np.ndarray:
    """An array file read into memory, checked against its manifest entry in one pass.

    Raises:
        CheckpointCorruptError: if the file is missing or differs from its entry.
    """
    with ThreadPoolExecutor(1) as pool:
        arr, check = _read_into(directory, name, info, None, pool, progress)
        check()
    return arr


def read_column(
    directory: Path, names: list[str], files: Mapping[str, Any], out: np.ndarray, progress=None
) -> None:
    """Read a column's chunk files in order into ``out``, each checked against its entry.

    Raises:
        CheckpointCorruptError: if a file is missing or differs from its entry.
    """
    with ThreadPoolExecutor(1) as pool:
        checks = []
        at = 0
        for name in names:
            rows = files[name]["shape"][0]
            checks.append(
                _read_into(directory, name, files[name], out[at : at + rows], pool, progress)[1]
            )
            at += rows
        for check in checks:
            check()


def _read_into(
    directory: Path,
    name: str,
    info: Mapping[str, Any],
    out: np.ndarray | None,
    pool: ThreadPoolExecutor,
    progress,
) -> tuple[np.ndarray, Callable[[], None]]:
    """Read the file into ``out``; returns the array and a check of checksum and header."""
    path = directory / name
    shape, dtype, offset = npy_layout(path, info)
    arr = np.empty(shape, dtype) if out is None else out
    if arr.shape != shape or arr.dtype != dtype or not arr.flags.c_contiguous:
        raise CheckpointCorruptError(f"{path} holds {dtype}{list(shape)}, not a part here")
    try:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed below, on every path)
    except OSError:
        raise CheckpointCorruptError(
            f"{path} is missing; the checkpoint {directory} is incomplete: restore from "
            "another checkpoint"
        ) from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size != info["bytes"]:
            raise CheckpointCorruptError(
                f"{path} holds {size} bytes, the manifest says {info['bytes']}; the "
                f"checkpoint {directory} is damaged: restore from another checkpoint"
            )
        header = f.read(offset)  # parsed only once the checksum matched
        view = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(b"")
        pending = pool.submit(zlib.crc32, header)
        at = 0
        while at < len(view):
            got = f.readinto(view[at : at + READ_BYTES])
            if not got:
                break
            pending = pool.submit(_chain_crc, view[at : at + got], pending)
            at += got
            if progress is not None:
                progress(got)

    def check() -> None:
        if len(header) != offset or at != len(view) or pending.result() != info["crc32"]:
            raise CheckpointCorruptError(
                f"{path} fails its checksum or is short; the checkpoint {directory} is "
                "damaged: restore from another checkpoint"
            )
        check_npy_header(header, path, info)

    return arr, check


def column_names(store: Mapping[str, Any]) -> dict[str, list[str]]:
    """A manifest store's column files, field path to its chunk files."""
    return {p: [v] if isinstance(v, str) else list(v) for p, v in store["columns"].items()}


def _chunk_shapes(directory: Path, store: Mapping[str, Any], files: Mapping[str, Any]) -> dict:
    """Per field path, the shape and dtype of the whole column its chunk files make."""
    out = {}
    for path, names in column_names(store).items():
        try:
            infos = [files[n] for n in names]
            rows = sum(int(i["shape"][0]) for i in infos)
            tails = {tuple(i["shape"][1:]) for i in infos}
            dtypes = {i["dtype"] for i in infos}
            ok = rows == store["capacity"] and len(tails) == 1 and len(dtypes) == 1
        except (KeyError, TypeError, IndexError, ValueError):
            ok = False
        if not ok:
            raise CheckpointCorruptError(
                f"{directory}: the files of column {path!r} do not make a column of "
                f"{store.get('capacity')} rows; the checkpoint is damaged: restore from "
                "another checkpoint"
            )
        dtype = np.lib.format.descr_to_dtype(dtypes.pop())
        out[path] = ((rows, *tails.pop()), dtype)
    return out


def _map_column(directory: Path, names: list[str], files: Mapping[str, Any], shape, dtype):
    """A column mapped from its chunk files, or ``None`` where they cannot be mapped."""
    if len(names) == 1:
        return map_array(directory, names[0], files[names[0]])
    parts = []
    for name in names:
        path, info = directory / name, files[name]
        offset = read_header(path, info)[2]
        parts.append((path, offset, info["bytes"] - offset))
    return map_parts(parts, shape, dtype)


class Loaded:
    """A checkpoint read into memory (or mapped): manifest, states, columns."""

    def __init__(self, directory: Path, manifest: dict, mmap: bool, verify: bool, progress):
        self.directory = directory
        self.manifest = manifest
        files = manifest["files"]
        shapes = [_chunk_shapes(directory, s, files) for s in manifest["stores"]]
        column_files = {n for s in manifest["stores"] for v in column_names(s).values() for n in v}
        total = sum(files[n]["bytes"] for n in column_files)
        bar = Progress(progress, total if not mmap or verify else 0, "restore")
        try:
            if mmap:  # mapped, not read: sizes (and with verify, checksums) first
                columns_only = {"files": {n: files[n] for n in column_files}}
                skip = set() if verify else column_files
                check_files(directory, columns_only, skip_crc=skip, progress=bar.update)
            self.columns: list[dict[str, np.ndarray]] = []
            for s, shape in zip(manifest["stores"], shapes):
                cols = {}
                for path, names in column_names(s).items():
                    col = None
                    if mmap:
                        col = _map_column(directory, names, files, *shape[path])
                    if col is None:
                        col = np.empty(*shape[path])
                        read_column(directory, names, files, col, bar.update)
                    cols[path] = col
                self.columns.append(cols)
        finally:
            bar.close()

        def load(name: str) -> np.ndarray:
            if name not in files:
                raise CheckpointCorruptError(f"{directory}: {name} is not in the manifest")
            return read_array(directory, name, files[name])

        self.states = [unflatten_state(t["state"], load) for t in manifest["tables"]]
        extra = manifest.get("extra")
        self.extra = None if extra is None else unflatten_state(extra, load)


def _candidates(root: Path) -> list[Path]:
    if (root / MANIFEST).exists() or retention.sequence_of(root) is not None:
        return [root]
    found = retention.published(root)
    if not found:
        raise CheckpointNotFoundError(
            f"{root} holds no checkpoint (no {MANIFEST} and no ckpt-* directories); give the "
            "directory a save wrote into, or one of its ckpt-* directories"
        )
    return found


def load(root: Path, mmap: bool, verify: bool | None, progress: bool) -> Loaded:
    """The newest valid checkpoint at ``root`` (itself, or the newest under it).

    Raises:
        CheckpointNotFoundError: if none under ``root`` is complete and valid.
        CheckpointCorruptError: if ``root`` itself is a damaged checkpoint.
        CheckpointVersionError: if the checkpoint chosen is of another format version.
    """
    full = (not mmap) if verify is None else bool(verify)
    candidates = _candidates(root)
    skipped = []
    for directory in candidates:
        try:
            return Loaded(directory, read_manifest(directory), mmap, full, progress)
        except CheckpointCorruptError as exc:
            if len(candidates) == 1 and directory == root:
                raise
            warnings.warn(f"skipping checkpoint {directory.name}: {exc}", stacklevel=3)
            skipped.append(f"{directory.name}: {exc}")
    raise CheckpointNotFoundError(
        f"no complete, valid checkpoint under {root}; skipped: " + " | ".join(skipped)
    )


def check_path(path: Any) -> Path:
    """``path`` as a directory to restore from.

    Raises:
        InvalidArgumentError: if it is not a path.
        CheckpointNotFoundError: if it is not a directory.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"path={describe(path)} must be a directory path")
    root = Path(path)
    if not root.is_dir():
        what = "is a file" if root.exists() else "does not exist"
        raise CheckpointNotFoundError(
            f"path={str(root)!r} {what}; give the directory a save wrote into, or one of "
            "its ckpt-* directories"
        )
    return root
