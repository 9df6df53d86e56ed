"""Compact link messages: a learner's per-step awaited calls in fixed binary layouts.

An awaited ``update_priorities`` (or ``delete``) of a batch's keys is what a learner sends
every step. On a direct link (:mod:`rlreplay.net.direct`) its request and its reply may
travel in the fixed layouts below instead of a msgpack header and a packed array frame:
packing and unpacking a header, and describing and checking two arrays, cost more than the
table's own update of 256 priorities. A compact message holds the same fields as the
general one and is served by the same code; only the encoding differs, so the server
checks its envelope, its client's limits and its table exactly as it checks any request.

Layouts (little-endian, every part at an 8-byte aligned offset):

- Request: ``magic`` u32 (:data:`REQUEST_MAGIC` | op code), table name length u16,
  field flags u16 (which of epoch, expires, lease are present), request id u64, epoch i64,
  expires f64, lease f64, key count u32, priority count u32, the table name (UTF-8,
  padded to 8 bytes), the keys (int64), the priorities (float64; none for ``delete``).
- Reply (a success with a count): ``magic`` u32 (:data:`REPLY_MAGIC` | op code), 4 bytes
  zero, request id u64, epoch i64, server clock f64, count i64. Errors, and everything
  else, are general messages.

A general link message starts with its header length, at most
:data:`~rlreplay.net.direct.DIRECT_MAX_BYTES`, so the magic numbers (far above it) tell the
two apart. A request that does not fit a compact layout (keys that are not a 1-d int64
array, one priority for all keys, other header fields) is sent as a general message.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from rlreplay.errors import ProtocolError
from rlreplay.net.direct import DIRECT_MAX_BYTES
from rlreplay.net.wire import PROTOCOL_VERSION

OPS = {"update_priorities": 1, "delete": 2}
OP_OF = {code: op for op, code in OPS.items()}
REQUEST_MAGIC = 0xC5A7_0000
REPLY_MAGIC = 0xC5A7_8000
_MAGIC_MASK = 0xFFFF_FF00

REQUEST = struct.Struct("<IHHQqddII")  # magic, name length, flags, id, epoch, expires, lease, n, m
REPLY = struct.Struct("<IIQqdq")  # magic, zero, id, epoch, server clock, count
_MAGIC = struct.Struct("<I")
_EPOCH, _EXPIRES, _LEASE = 1, 2, 4
_FIELDS = frozenset({"op", "table", "id", "epoch", "expires", "lease"})
_INT64_MAX = (1 << 63) - 1


def _padded(n: int) -> int:
    return (n + 7) & ~7


def encode_request(header: dict, arrays: dict | None) -> list | None:
    """The buffers of ``header`` and ``arrays`` as one compact request, or None if they do
    not fit its layout or a link message (they are then sent as a general message, through
    ZeroMQ if too large). Nothing is changed."""
    code = OPS.get(header.get("op"))
    if code is None or not header.keys() <= _FIELDS or arrays is None:
        return None
    keys = arrays.get("keys")
    prios = arrays.get("priorities")
    if (
        type(keys) is not np.ndarray
        or keys.dtype != np.int64
        or keys.ndim != 1
        or not keys.flags.c_contiguous
        or len(arrays) != (1 if prios is None else 2)
    ):
        return None
    if code == 1:
        if (
            type(prios) is not np.ndarray
            or prios.dtype != np.float64
            or prios.ndim != 1
            or not prios.flags.c_contiguous
        ):
            return None
    elif prios is not None:
        return None
    rid, table = header.get("id"), header.get("table")
    if type(rid) is not int or not 0 <= rid <= _INT64_MAX or type(table) is not str:
        return None
    name = table.encode()
    if len(name) > 0xFFFF:
        return None
    flags = 0
    epoch, expires, lease = header.get("epoch"), header.get("expires"), header.get("lease")
    if epoch is not None:
        if type(epoch) is not int or not -_INT64_MAX <= epoch <= _INT64_MAX:
            return None
        flags |= _EPOCH
    if expires is not None:
        if type(expires) is not float:
            return None
        flags |= _EXPIRES
    if lease is not None:
        if type(lease) is not float:
            return None
        flags |= _LEASE
    m = 0 if prios is None else len(prios)
    if REQUEST.size + _padded(len(name)) + 8 * (len(keys) + m) > DIRECT_MAX_BYTES:
        return None  # larger than a link message: through ZeroMQ
    head = REQUEST.pack(
        REQUEST_MAGIC | code,
        len(name),
        flags,
        rid,
        epoch or 0,
        expires or 0.0,
        lease or 0.0,
        len(keys),
        m,
    ) + name.ljust(_padded(len(name)), b"\0")
    return [head, keys] if prios is None else [head, keys, prios]


def is_request(data: Any) -> bool:
    """Whether a link message is a compact request."""
    return len(data) >= 4 and _MAGIC.unpack_from(data)[0] & _MAGIC_MASK == REQUEST_MAGIC


def is_reply(data: Any) -> bool:
    """Whether a link message is a compact reply."""
    return len(data) >= 4 and _MAGIC.unpack_from(data)[0] & _MAGIC_MASK == REPLY_MAGIC


def request_id(data: Any) -> int | None:
    """The id of a compact request (to answer even a malformed one under it), if readable."""
    return REQUEST.unpack_from(data)[3] if len(data) >= REQUEST.size else None


def decode_request(data: Any) -> tuple[dict, dict[str, np.ndarray]]:
    """The header and arrays of a compact request, as :func:`rlreplay.net.wire.decode`
    gives them for the same request sent as a general message (the arrays are views
    over ``data``).

    Raises:
        ProtocolError: for a message shorter or longer than its counts say, an unknown
            operation, a table name that is not UTF-8, or priorities sent with a delete.
    """
    if len(data) < REQUEST.size:
        raise ProtocolError(f"a compact request of {len(data)} bytes is shorter than its header")
    magic, name_len, flags, rid, epoch, expires, lease, n, m = REQUEST.unpack_from(data)
    op = OP_OF.get(magic & 0xFF)
    if op is None or magic & _MAGIC_MASK != REQUEST_MAGIC:
        raise ProtocolError(f"unknown compact operation {magic:#x}")
    if op == "delete" and m:
        raise ProtocolError("a compact delete carries no priorities")
    at = REQUEST.size + _padded(name_len)
    if len(data) != at + 8 * (n + m):
        raise ProtocolError(
            f"a compact request of {len(data)} bytes does not hold the {n} keys and {m} "
            "priorities it announces"
        )
    try:
        table = bytes(data[REQUEST.size : REQUEST.size + name_len]).decode()
    except UnicodeDecodeError:
        raise ProtocolError("the table name of a compact request is not UTF-8") from None
    header: dict[str, Any] = {"op": op, "table": table, "id": rid, "v": PROTOCOL_VERSION}
    if flags & _EPOCH:
        header["epoch"] = epoch
    if flags & _EXPIRES:
        header["expires"] = expires
    if flags & _LEASE:
        header["lease"] = lease
    arrays = {"keys": np.frombuffer(data, np.int64, n, at)}
    if op == "update_priorities":
        arrays["priorities"] = np.frombuffer(data, np.float64, m, at + 8 * n)
    return header, arrays


def encode_reply(op: str, rid: Any, epoch: int, now: float, result: dict) -> bytes | None:
    """A compact reply to a compact request: the result ``{"count": n}`` of ``op``, or
    None if the result or request id does not fit the layout (a general reply then)."""
    count = result.get("count")
    if (
        len(result) != 1
        or type(count) is not int
        or type(rid) is not int
        or not 0 <= rid <= _INT64_MAX
        or not math.isfinite(now)
    ):
        return None
    return REPLY.pack(REPLY_MAGIC | OPS[op], 0, rid, epoch, now, count)


def decode_reply(data: Any) -> dict:
    """The header of a compact reply, as the general reply's header would read.

    Raises:
        ProtocolError: for a message of another length or an unknown operation.
    """
    if len(data) != REPLY.size:
        raise ProtocolError(f"a compact reply of {len(data)} bytes; it must be {REPLY.size}")
    magic, _, rid, epoch, now, count = REPLY.unpack(data)
    if magic & 0xFF not in OP_OF:
        raise ProtocolError(f"unknown compact operation {magic:#x}")
    return {"id": rid, "ok": True, "epoch": epoch, "now": now, "count": count}
