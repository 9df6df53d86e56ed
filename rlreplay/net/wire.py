"""Wire codec: one message is a msgpack header frame followed by raw array frames.

Every header is a msgpack map that carries the protocol version under ``"v"``. Arrays are
never pickled: the header lists each array's name, dtype string and shape under ``"arrays"``,
and the array's bytes travel as their own ZeroMQ frame, in the same order. Large frames
are sent without copying (pyzmq keeps a reference to the numpy buffer) and received
without copying (the array is a view over the received frame). See ``docs/protocol.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from rlreplay import errors

PROTOCOL_VERSION = 1

# Frames at least this large are handed to ZeroMQ without a copy; smaller ones are copied,
# which is cheaper than the bookkeeping zero-copy needs.
ZERO_COPY_BYTES = 65536

# Error codes carried in reply headers (``"code"``). Clients raise the class by its code,
# never by matching message text. Codes are part of the protocol: never renumber them.
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
    """Frames of one message: the packed header, then one frame per array.

    Arrays are made C-contiguous (copied only if they are not); their names, dtypes and
    shapes are recorded in the header under ``"arrays"``.
    """
    frames: list = [b""]
    if arrays:
        meta = []
        for name, arr in arrays.items():
            a = np.ascontiguousarray(arr)
            meta.append((name, a.dtype.str, a.shape))
            frames.append(a if a.nbytes >= ZERO_COPY_BYTES else a.tobytes())
        header["arrays"] = meta
    header["v"] = PROTOCOL_VERSION
    frames[0] = msgpack.packb(header, use_bin_type=True)
    return frames


def decode(frames: Sequence[Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Header and arrays of one message (``frames`` as received, bytes or zmq Frames).

    Arrays are views over the received frames when pyzmq allows it (no copy).

    Raises:
        ProtocolError: on a malformed header, a different protocol version, a dtype that
            is not numeric, or frames whose sizes do not match the declared arrays.
    """
    if not frames:
        raise errors.ProtocolError("empty message")
    try:
        header = msgpack.unpackb(_bytes(frames[0]), raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise errors.ProtocolError(f"malformed message header: {exc}") from None
    if not isinstance(header, dict):
        raise errors.ProtocolError("message header is not a map")
    version = header.get("v")
    if version != PROTOCOL_VERSION:
        raise errors.ProtocolError(
            f"protocol version {version!r} is not supported; this side speaks "
            f"{PROTOCOL_VERSION} (upgrade the older of client and server)"
        )
    meta = header.pop("arrays", None) or []
    if not isinstance(meta, list) or len(meta) != len(frames) - 1:
        raise errors.ProtocolError(
            f"message declares {len(meta) if isinstance(meta, list) else meta!r} arrays "
            f"but carries {len(frames) - 1} data frames"
        )
    arrays: dict[str, np.ndarray] = {}
    for entry, frame in zip(meta, frames[1:]):
        try:
            name, dtype_str, shape = entry
            dtype = _DTYPES.get(dtype_str) or _dtype(dtype_str)
            shape = tuple(int(d) for d in shape)
        except Exception:
            raise errors.ProtocolError(f"malformed array entry {entry!r}") from None
        if dtype is None or not isinstance(name, str):
            raise errors.ProtocolError(f"array {name!r} has dtype {dtype_str!r}, not allowed")
        buf = frame.buffer if hasattr(frame, "buffer") else frame
        nbytes = buf.nbytes if isinstance(buf, memoryview) else len(buf)
        count = math.prod(shape)
        if count * dtype.itemsize != nbytes or min(shape, default=0) < 0:
            raise errors.ProtocolError(
                f"array {name!r} declares shape {shape} of {dtype} but its frame holds "
                f"{nbytes} bytes"
            )
        arrays[name] = np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)
    return header, arrays


_DTYPES: dict[str, np.dtype] = {}


def _dtype(text: Any) -> np.dtype | None:
    """The numpy dtype named by ``text`` if it may cross the wire (cached), else None."""
    dtype = np.dtype(text)
    if dtype.kind not in _ALLOWED_KINDS or dtype.hasobject or dtype.fields is not None:
        return None
    if len(_DTYPES) < 256:
        _DTYPES[text] = dtype
    return dtype


def _bytes(frame: Any) -> bytes | memoryview:
    return frame.buffer if hasattr(frame, "buffer") else frame
