"""Wire codec: one message is a msgpack header frame followed by raw array frames.

Arrays are never pickled: the header lists each array's name, dtype, shape, frame and
offset. Small arrays share one packed frame; large ones get their own, sent without copy.
Received arrays are views over the frames. See docs/protocol.md.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from rlreplay import errors

PROTOCOL_VERSION = 2  # the one version spoken; a message of another is refused

# Frames at least this large go to ZeroMQ without a copy; copying smaller ones is cheaper.
ZERO_COPY_BYTES = 65536

# Error codes of reply headers (``"code"``); part of the protocol: never renumber them.
ERROR_CODES: dict[int, type[errors.ReplayError]] = {
    1: errors.ReplayError,
    2: errors.InvalidArgumentError,
    3: errors.SignatureError,
    4: errors.DeadlockError,
    5: errors.ReplayTimeoutError,
    6: errors.RateLimiterTimeoutError,
    7: errors.EmptyTableError,
    8: errors.ClosedError,
    9: errors.ProtocolError,
    10: errors.ServerUnavailableError,
    11: errors.ServerRestartedError,
    12: errors.ResourceLimitError,
    13: errors.CheckpointError,
}
CODE_OF: dict[type, int] = {cls: code for code, cls in ERROR_CODES.items()}
INTERNAL_ERROR = 1  # an unexpected server-side failure; reported as ReplayError

# dtypes that may cross the wire: numeric and boolean only (never object arrays).
_ALLOWED_KINDS = "biufc"


def error_code(exc: BaseException) -> int:
    """The protocol code of ``exc``: its own class's code or its nearest coded base."""
    for cls in type(exc).__mro__:
        if cls in CODE_OF:
            return CODE_OF[cls]
    return INTERNAL_ERROR


def error_from_code(code: Any, message: str) -> errors.ReplayError:
    """The typed error a reply with ``code`` stands for (unknown codes: ReplayError)."""
    cls = ERROR_CODES.get(code, errors.ReplayError) if isinstance(code, int) else errors.ReplayError
    return cls(message)


def encode(header: dict[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> list:
    """Frames of one message: the packed header, then the array frames.

    Args:
        header: the message's header fields (``"v"`` and ``"arrays"`` are filled in).
        arrays: named arrays of numeric dtypes.

    Returns:
        The frames, ready for ``send_multipart``.
    """
    frames: list = [b""]
    if arrays:
        header["arrays"] = _pack(arrays, frames)
    header["v"] = PROTOCOL_VERSION
    frames[0] = _packer().pack(header)
    return frames


_LOCAL = threading.local()


def _packer() -> msgpack.Packer:
    """This thread's reused msgpack packer (``packb`` makes a costly new one per call)."""
    packer = getattr(_LOCAL, "packer", None)
    if packer is None:
        packer = _LOCAL.packer = msgpack.Packer(use_bin_type=True)
    return packer


def frames_nbytes(frames: Sequence[Any]) -> int:
    """Bytes in encoded frames (arrays and bytes-like), as sent or held for sending."""
    return sum(f.nbytes if isinstance(f, np.ndarray) else len(f) for f in frames)


def _contiguous(a: Any) -> np.ndarray:
    """``a`` as a C-contiguous array of the same shape (0-d stays 0-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


ALIGN = 8  # byte alignment of arrays in a packed frame
_PAD = bytes(ALIGN)


def _pack(arrays: Mapping[str, np.ndarray], frames: list) -> list:
    """Append the array frames to ``frames``; returns the ``"arrays"`` entries."""
    meta: list = []
    parts: list = []
    large: list = []
    offset = 0
    for name, a in arrays.items():
        if type(a) is not np.ndarray or not a.flags.c_contiguous:
            a = _contiguous(a)
        nbytes = a.nbytes
        if nbytes >= ZERO_COPY_BYTES:
            meta.append([name, a.dtype.str, a.shape, -1 - len(large), 0])
            large.append(a)
            continue
        meta.append([name, a.dtype.str, a.shape, 1, offset])
        parts.append(a)  # bytes.join reads any C-contiguous buffer
        offset += nbytes
        pad = -offset % ALIGN
        if pad:
            parts.append(_PAD[:pad])
            offset += pad
    if parts:
        frames.append(b"".join(parts))
    if large:
        first_large = 2 if parts else 1
        for entry in meta:
            if entry[3] < 0:
                entry[3] = first_large - 1 - entry[3]
        frames.extend(large)
    return meta


MAX_DIMS = 32  # most dimensions an array may declare (numpy's own limit is 64)
MAX_DIM = 2**40  # largest extent of one dimension
# numpy refuses a shape spanning more bytes than this, even with a zero extent.
MAX_NBYTES = int(np.iinfo(np.intp).max)


def array_extent(shape: Any, itemsize: int) -> tuple[int, int]:
    """``(elements, bytes)`` of an array of ``shape`` with ``itemsize``-byte elements.

    Invariant of every received shape: at most ``MAX_DIMS`` ints in ``0 .. MAX_DIM`` whose
    non-zero extents times ``itemsize`` stay within ``MAX_NBYTES``, so numpy can build it.

    Raises:
        ValueError: naming the shape, for one that breaks the invariant.
    """
    if type(shape) is not list and type(shape) is not tuple:
        raise ValueError(f"shape {errors.describe(shape)} is not a list of ints")
    if len(shape) > MAX_DIMS:
        raise ValueError(f"shape of {len(shape)} dimensions (at most {MAX_DIMS})")
    count = 1
    spread = itemsize  # bytes of the shape with its zero extents left out
    for d in shape:
        if type(d) is not int or not 0 <= d <= MAX_DIM:
            raise ValueError(f"shape {errors.describe(shape)} has extent {errors.describe(d)}")
        count *= d
        if d:
            spread *= d
    if spread > MAX_NBYTES:
        raise ValueError(
            f"shape {errors.describe(shape)} of {itemsize}-byte elements spans "
            f"{spread} bytes (at most {MAX_NBYTES})"
        )
    return count, count * itemsize


def decode(frames: Sequence[Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Header and arrays of one message (arrays are views over the frames where possible).

    Raises:
        ProtocolError: as :func:`decode_header` and :func:`decode_arrays`.
    """
    header = decode_header(frames)
    return header, decode_arrays(header, frames)


def decode_header(frames: Sequence[Any]) -> dict[str, Any]:
    """The header of one message, with its request id checked (the version is checked by
    :func:`decode_arrays`, so an error can be answered under the request's id).

    Raises:
        ProtocolError: on an empty message, a header that is not a msgpack map, or an
            ``id`` that is not an int, a short str or nil.
    """
    if not frames:
        raise errors.ProtocolError("empty message")
    try:
        header = msgpack.unpackb(_bytes(frames[0]), raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise errors.ProtocolError(f"malformed message header: {exc}") from None
    if not isinstance(header, dict):
        raise errors.ProtocolError("message header is not a map")
    rid = header.get("id")
    if not (
        rid is None
        or (isinstance(rid, int) and not isinstance(rid, bool))
        or (isinstance(rid, str) and len(rid) <= 256)
    ):
        header["id"] = None  # it is echoed in the reply: never echo what cannot be packed
        raise errors.ProtocolError(f"request id {errors.describe(rid)} is not an int")
    return header


def decode_arrays(header: dict[str, Any], frames: Sequence[Any]) -> dict[str, np.ndarray]:
    """The arrays of a message whose header :func:`decode_header` returned (popping ``"arrays"``).

    Raises:
        ProtocolError: for another protocol version than :data:`PROTOCOL_VERSION`, or a
            malformed array entry (name, dtype, shape, alignment or size).
    """
    version = header.get("v")
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise errors.ProtocolError(
            f"protocol version {errors.describe(version)} is not supported; this side speaks "
            f"{PROTOCOL_VERSION} (install the same rlreplay version on client and server)"
        )
    meta = header.pop("arrays", None) or []
    if not isinstance(meta, list):
        raise errors.ProtocolError(f"message declares arrays {errors.describe(meta)}, not a list")
    if not meta:
        return {}
    buffers = [_bytes(f) for f in frames]
    arrays: dict[str, np.ndarray] = {}
    for entry in meta:
        try:
            name, dtype_str, shape, index, offset = entry
            dtype = _DTYPES.get(dtype_str) or dtype_of(dtype_str)
            if type(shape) is list and len(shape) == 1:  # the common case, checked inline
                count = shape[0]
                if type(count) is not int or not 0 <= count <= MAX_DIM:
                    raise ValueError(shape)
            else:
                count = array_extent(shape, 1 if dtype is None else dtype.itemsize)[0]
            if type(offset) is not int or type(index) is not int or index < 1:
                raise ValueError(entry)
            buf = buffers[index]
        except Exception:
            raise errors.ProtocolError(f"malformed array entry {errors.describe(entry)}") from None
        if dtype is None or type(name) is not str:
            raise errors.ProtocolError(
                f"array {errors.describe(name)} has dtype {errors.describe(dtype_str)}, not allowed"
            )
        if name in arrays:
            raise errors.ProtocolError(f"array {name!r} is given twice")
        nbytes = buf.nbytes if type(buf) is memoryview else len(buf)
        size = count * dtype.itemsize
        if not 0 <= offset <= nbytes - size or offset % dtype.alignment:
            raise errors.ProtocolError(
                f"array {name!r} declares shape {tuple(shape)} of {dtype} at frame {index!r}, "
                f"byte {offset!r}, but that frame holds {nbytes} bytes (offsets are multiples "
                "of the dtype's alignment)"
            )
        a = np.frombuffer(buf, dtype, count, offset)  # positional: keywords cost more
        arrays[name] = a if len(shape) == 1 else a.reshape(shape)
    return arrays


_DTYPES: dict[str, np.dtype] = {}


def dtype_of(text: Any) -> np.dtype | None:
    """The numpy dtype named by ``text`` if it may cross the wire (cached), else None."""
    if not isinstance(text, str) or len(text) > 16:
        return None
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError):  # what numpy raises for unknown names
        return None
    if dtype.kind not in _ALLOWED_KINDS or dtype.hasobject or dtype.fields is not None:
        return None
    if len(_DTYPES) < 256:
        _DTYPES[text] = dtype
    return dtype


def _bytes(frame: Any) -> bytes | memoryview:
    """The bytes of a received frame: a ``zmq.Frame``'s buffer (no copy), else the frame."""
    return getattr(frame, "buffer", frame)
