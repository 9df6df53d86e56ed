"""The checkpoint format: file names, the manifest, array files and their checksums.

Nothing is pickled: arrays are ``.npy`` files, the rest JSON; ``manifest.json`` lists each
file's size and crc32 and carries its own checksum. See docs/checkpoints.md.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlreplay.errors import CheckpointCorruptError, CheckpointVersionError, describe

FORMAT = "rlreplay-checkpoint"
FORMAT_VERSION = 3
# Versions read: 1 (one file per column), 2 (chunk files), 3 (idle remover's state left out).
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"
CHUNK_BYTES = 8 << 20  # streamed reads, writes and checksums go this many bytes at a time


def npy_header(shape: tuple[int, ...], dtype: np.dtype, align: int = 0) -> bytes:
    """The ``.npy`` header of a C-ordered array, padded to a multiple of ``align`` bytes."""
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
        "fortran_order": False,
        "shape": tuple(int(s) for s in shape),
    }
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, header)
    except ValueError:
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, header)
    out = buf.getvalue()
    if align and len(out) % align:
        # then pad the header dict further and fix the length
        fmt = "<H" if out[6] == 1 else "<I"
        start = 6 + 2 + struct.calcsize(fmt)
        total = -(-len(out) // align) * align
        body = out[start:].rstrip(b" \n")
        body += b" " * (total - start - len(body) - 1) + b"\n"
        out = out[:8] + struct.pack(fmt, len(body)) + body
    return out


def write_array(path: Path, arr: np.ndarray) -> dict[str, Any]:
    """Write ``arr`` as ``.npy`` and fsync it; returns its manifest entry."""
    header = npy_header(arr.shape, arr.dtype)
    crc, size = zlib.crc32(header), len(header)
    rows = max(1, CHUNK_BYTES // max(1, arr[:1].nbytes)) if arr.ndim else 1
    with open(path, "wb") as f:
        f.write(header)
        for start in range(0, len(arr) if arr.ndim else 1, rows):
            part = np.ascontiguousarray(arr[start : start + rows] if arr.ndim else arr)
            data = memoryview(part.reshape(-1).view(np.uint8))
            f.write(data)
            crc = zlib.crc32(data, crc)
            size += len(data)
        f.flush()
        os.fsync(f.fileno())
    return entry(size, crc, arr.dtype, arr.shape)


def entry(nbytes: int, crc: int, dtype: np.dtype, shape: tuple[int, ...]) -> dict[str, Any]:
    """A ``files`` entry of the manifest."""
    return {
        "bytes": int(nbytes),
        "crc32": int(crc),
        "dtype": np.lib.format.dtype_to_descr(np.dtype(dtype)),
        "shape": [int(s) for s in shape],
    }


def file_crc(path: Path, progress: Callable[[int], None] | None = None) -> tuple[int, int]:
    """``(bytes, crc32)`` of a whole file, read in chunks."""
    crc, total = 0, 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK_BYTES)
        view = memoryview(buf)
        while True:
            got = f.readinto(buf)
            if not got:
                return total, crc
            crc = zlib.crc32(view[:got], crc)
            total += got
            if progress is not None:
                progress(got)


class FileBacked:
    """A state array already written into its checkpoint file ``name``."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"FileBacked({self.name!r})"


def state_file_name(prefix: str, key: str) -> str:
    """The file name :func:`flatten_state` gives the array at key path ``prefix.key``."""
    return f"{prefix}.{key}.npy"


def flatten_state(state: Mapping[str, Any], prefix: str, arrays: dict[str, np.ndarray]) -> dict:
    """``state`` as JSON, each array moved to ``arrays`` and replaced by ``{"file": name}``."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        name = f"{prefix}.{key}"
        if isinstance(value, FileBacked):
            out[key] = {"file": value.name}
        elif isinstance(value, np.ndarray):
            arrays[state_file_name(prefix, key)] = value
            out[key] = {"file": state_file_name(prefix, key)}
        elif isinstance(value, Mapping):
            out[key] = flatten_state(value, name, arrays)
        else:
            out[key] = value.item() if isinstance(value, np.generic) else value
    return out


def unflatten_state(data: Mapping[str, Any], load: Callable[[str], np.ndarray]) -> dict:
    """Inverse of :func:`flatten_state`: ``{"file": name}`` becomes ``load(name)``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and set(value) == {"file"}:
            out[key] = load(value["file"])
        elif isinstance(value, Mapping):
            out[key] = unflatten_state(value, load)
        else:
            out[key] = value
    return out


CHECKSUM = "manifest_crc32"  # the manifest's entry for its own checksum


def _manifest_crc(manifest: Mapping[str, Any]) -> int:
    """crc32 of ``manifest`` without its checksum entry, as :func:`write_manifest` writes it."""
    body = {k: v for k, v in manifest.items() if k != CHECKSUM}
    return zlib.crc32(json.dumps(body, indent=1, sort_keys=False).encode("utf-8"))


def write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest.json`` into ``directory`` with its own checksum last, and fsync it."""
    path = directory / MANIFEST
    body = {k: v for k, v in manifest.items() if k != CHECKSUM}
    body[CHECKSUM] = _manifest_crc(body)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=1, sort_keys=False)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of the checkpoint in ``directory``, its format checked.

    Raises:
        CheckpointCorruptError: if it is missing or not a checkpoint manifest.
        CheckpointVersionError: if it was written in another format version.
    """
    path = directory / MANIFEST
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise CheckpointCorruptError(
            f"{directory} holds no {MANIFEST}: it is not a complete checkpoint (a save that "
            "never finished); restore from another checkpoint"
        ) from None
    except (OSError, ValueError) as exc:
        raise CheckpointCorruptError(
            f"{path} cannot be read as JSON ({exc}); the checkpoint is damaged: restore from "
            "another checkpoint"
        ) from None
    if isinstance(manifest, dict) and CHECKSUM in manifest:
        stored = manifest.pop(CHECKSUM)
        if stored != _manifest_crc(manifest):
            raise CheckpointCorruptError(
                f"{path} fails its own checksum ({CHECKSUM} {describe(stored)}); the "
                f"checkpoint {directory} is damaged: restore from another checkpoint"
            )
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointCorruptError(
            f"{path} is not an rlreplay checkpoint manifest (format "
            f"{describe_field(manifest, 'format')}); point restore at a checkpoint directory "
            "or the directory holding them"
        )
    version = manifest.get("format_version")
    if version not in READABLE_VERSIONS:
        raise CheckpointVersionError(
            f"{directory} is in checkpoint format version {version!r}, but this rlreplay "
            f"reads versions {list(READABLE_VERSIONS)}; restore it with the rlreplay version "
            f"that wrote it ({manifest.get('rlreplay_version')!r}) and export its data, or take "
            "a new checkpoint"
        )
    for key in ("stores", "tables", "files"):
        if not isinstance(manifest.get(key), (list, dict)):
            raise CheckpointCorruptError(f"{path} has no valid {key!r} entry; it is damaged")
    _check_entries(path, manifest)
    return manifest


_ENTRIES = {
    "stores": ("signature", "capacity", "lanes", "state", "columns"),
    "tables": ("name", "store", "definition", "state"),
    "files": ("bytes", "crc32", "dtype", "shape"),
}
_TABLE_STATE = ("index", "rate_limiter", "rng")


def _check_entries(path: Path, manifest: Mapping[str, Any]) -> None:
    """Refuse a manifest that lacks what restore reads (CheckpointCorruptError)."""
    files = manifest["files"]
    groups = {
        "stores": enumerate(manifest["stores"]) if isinstance(manifest["stores"], list) else None,
        "tables": enumerate(manifest["tables"]) if isinstance(manifest["tables"], list) else None,
        "files": files.items() if isinstance(files, dict) else None,
    }
    for group, entries in groups.items():
        if entries is None:
            raise CheckpointCorruptError(f"{path}: {group!r} has the wrong type; it is damaged")
        for name, entry in entries:
            needed = _ENTRIES[group] + (_TABLE_STATE if group == "tables" else ())
            have = dict(entry) if isinstance(entry, dict) else {}
            if group == "tables" and isinstance(have.get("state"), dict):
                have.update(have["state"])
            missing = [k for k in needed if k not in have]
            if missing:
                raise CheckpointCorruptError(
                    f"{path}: {group} entry {name!r} lacks {missing}; the checkpoint is "
                    "damaged: restore from another checkpoint"
                )


def describe_field(manifest: Any, key: str) -> str:
    return repr(manifest.get(key)) if isinstance(manifest, dict) else "missing"


def check_files(
    directory: Path,
    manifest: Mapping[str, Any],
    skip_crc: set[str] = frozenset(),
    progress: Callable[[int], None] | None = None,
) -> None:
    """Check every listed file's size and checksum (files in ``skip_crc`` by size only).

    Raises:
        CheckpointCorruptError: naming the first file that is missing or differs.
    """
    for name, info in manifest["files"].items():
        path = directory / name
        try:
            size = path.stat().st_size
        except OSError:
            raise CheckpointCorruptError(
                f"{path} is missing; the checkpoint {directory} is incomplete: restore from "
                "another checkpoint"
            ) from None
        if size != info["bytes"]:
            raise CheckpointCorruptError(
                f"{path} holds {size} bytes, the manifest says {info['bytes']}; the "
                f"checkpoint {directory} is damaged: restore from another checkpoint"
            )
        if name in skip_crc:
            continue
        _, crc = file_crc(path, progress)
        if crc != info["crc32"]:
            raise CheckpointCorruptError(
                f"{path} fails its checksum (crc32 {crc:#010x}, the manifest says "
                f"{info['crc32']:#010x}); the checkpoint {directory} is damaged: restore from "
                "another checkpoint"
            )


def npy_layout(path: Path, info: Mapping[str, Any]) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, header bytes)`` of the array file at ``path`` from its manifest entry.

    Raises:
        CheckpointCorruptError: if the entry's shape, dtype or size make no array file.
    """
    try:
        shape = tuple(info["shape"])
        if not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"shape {shape}")
        dtype = np.lib.format.descr_to_dtype(info["dtype"])
        if dtype.hasobject:
            raise ValueError(f"dtype {dtype} holds objects")
        data = math.prod(shape) * dtype.itemsize
        offset = int(info["bytes"]) - data
        if offset < MIN_HEADER:
            raise ValueError(f"{info['bytes']} bytes cannot hold {data} bytes of data and a header")
    except Exception as exc:  # a damaged entry: numpy raises several unrelated types
        raise CheckpointCorruptError(
            f"{path}: its manifest entry describes no array file ({exc}); the checkpoint is "
            "damaged: restore from another checkpoint"
        ) from None
    return shape, dtype, offset


MIN_HEADER = 10  # magic (6), version (2), header length (2)


def check_npy_header(header: bytes, path: Path, info: Mapping[str, Any]) -> None:
    """Check that ``header`` is the ``.npy`` header of exactly the array ``info`` gives.

    Raises:
        CheckpointCorruptError: naming the file, if it cannot be parsed or differs.
    """
    f = io.BytesIO(header)
    try:
        version = np.lib.format.read_magic(f)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read(f)
        descr = np.lib.format.dtype_to_descr(dtype)
    except Exception as exc:  # numpy's header parser raises many types on damaged bytes
        raise CheckpointCorruptError(
            f"{path} is not a readable .npy file ({type(exc).__name__}: {exc}); the "
            "checkpoint is damaged: restore from another checkpoint"
        ) from None
    if fortran or list(shape) != list(info["shape"]) or descr != info["dtype"]:
        raise CheckpointCorruptError(
            f"{path} holds {dtype}{list(shape)}, the manifest says "
            f"{info['dtype']}{info['shape']}; the checkpoint is damaged"
        )
    if f.tell() != len(header):
        raise CheckpointCorruptError(
            f"{path} has a header of {f.tell()} bytes where its manifest entry leaves "
            f"{len(header)}; the checkpoint is damaged: restore from another checkpoint"
        )


def read_header(path: Path, info: Mapping[str, Any]) -> tuple[tuple[int, ...], np.dtype, int]:
    """:func:`npy_layout` of the file at ``path``, its header read and checked.

    Raises:
        CheckpointCorruptError: if the file cannot be read, or as those two.
    """
    shape, dtype, offset = npy_layout(path, info)
    try:
        with open(path, "rb") as f:
            header = f.read(offset)
    except OSError as exc:
        raise CheckpointCorruptError(f"{path} cannot be read ({exc})") from None
    check_npy_header(header, path, info)
    return shape, dtype, offset


def map_array(directory: Path, name: str, info: Mapping[str, Any]) -> np.ndarray:
    """The array in file ``name``, header checked, memory-mapped copy-on-write.

    Raises:
        CheckpointCorruptError: if the header differs from its entry or mapping fails.
    """
    path = directory / name
    shape, dtype, offset = read_header(path, info)
    if math.prod(shape) == 0:  # nothing to map (mmap refuses an empty range)
        return np.empty(shape, dtype)
    try:
        arr = np.memmap(path, dtype, mode="c", offset=offset, shape=shape)
    except (OSError, ValueError) as exc:
        raise CheckpointCorruptError(f"{path} cannot be mapped ({exc})") from None
    return arr.view(np.ndarray)
