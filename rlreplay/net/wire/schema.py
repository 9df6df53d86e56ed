"""Request schemas: every header field and array of each operation, checked in one place.

Each operation of a server is one :class:`Operation` (its name, fields, arrays, handler
and whether it mutates or parks), declared in the server's table of operations
(:data:`rlreplay.net.server.operations.OPERATIONS`). The server checks every decoded request
against its operation (:func:`operation_of`, :meth:`Operation.check`) before any handler sees it,
so a handler only meets fields of the types it expects: a table name that is a list, a
count that is a string, values nested hundreds of levels deep or an array of the wrong
kind are answered with a typed error, never an internal one. Values a user passes through
a :class:`~rlreplay.Client` call (``table``, ``batch_size``, ``n``, ``timeout``,
``priority``) are :class:`InvalidArgumentError` when wrong, naming the argument; fields
only the library writes (writer ids, stream indices, flags, array layout) are
:class:`ProtocolError`. Ranges that depend on a table (``batch_size <= max_size``, keys of
the table, a chunk's anchors) are checked by the handlers, still before anything changes.
Unknown header keys are ignored (a newer client may send more); unknown arrays are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlreplay.errors import InvalidArgumentError, ProtocolError, check_timeout, describe

MAX_NAME = 1024  # longest table name accepted
MAX_TABLES = 64  # most tables one writer may name
MAX_COUNT = 2**31 - 1  # largest count (batch size, steps, history) a request may carry
MAX_STREAM = 2**62  # stream indices and sequence numbers stay below this


def table_name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise InvalidArgumentError(
            f"{key}={describe(value)} must be a table name (a non-empty str)"
        )
    return value


def count(value: Any, key: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_COUNT:
        raise InvalidArgumentError(
            f"{key}={describe(value)} must be an int in [{low}, {MAX_COUNT}]"
        )
    return value


def positive_count(value: Any, key: str) -> int:
    return count(value, key, low=1)


def size(value: Any, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise ProtocolError(f"request field {key!r} is {describe(value)}, not an int in [0, 2**31)")
    return value


def timeout(value: Any, key: str) -> float | None:
    return check_timeout(value, key)


def priority(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidArgumentError(f"{key}={describe(value)} must be a number (finite, >= 0)")
    if not (math.isfinite(value) and value >= 0):
        raise InvalidArgumentError(f"{key}={describe(value)} must be finite and >= 0")
    return value


def flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"request field {key!r} is {describe(value)}, not a bool")
    return value


def stream(value: Any, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_STREAM:
        raise ProtocolError(f"request field {key!r} is {describe(value)}, not an int in [0, 2**62)")
    return value


def writer_id(value: Any, key: str) -> bytes | int:
    """A writer id: 16 random bytes (or, from older clients, an int below 2**64)."""
    if isinstance(value, bytes) and len(value) == 16:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64:
        return value
    raise ProtocolError(f"request field {key!r} is {describe(value)}, not a writer id")


def table_names(value: Any, key: str) -> list[str]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_TABLES:
        raise InvalidArgumentError(
            f"{key}={describe(value)} must be a list of 1 to {MAX_TABLES} table names"
        )
    for name in value:
        table_name(name, key)
    if len(set(value)) != len(value):
        twice = next(n for i, n in enumerate(value) if n in value[:i])
        raise InvalidArgumentError(
            f"{key}={describe(value)} repeats {twice!r}; name each of a writer's tables once "
            "(its items index this list, and a table holds one item per anchor step)"
        )
    return value


def stream_indices(value: Any, key: str) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_COUNT:
        raise ProtocolError(f"request field {key!r} is {describe(value)}, not a list of ints")
    for v in value:
        stream(v, key)
    return value


Check = Callable[[Any, str], Any]
Field = tuple[Check, bool]  # a header field's check, and whether it is required
# An array's accepted dtype kinds, accepted ndim (None: any) and the error class for a wrong
# one. Keys and priorities come from a user's call: the table checks their shapes and
# values itself, and a wrong kind is that user's InvalidArgumentError. ``data/`` arrays are
# the signature's fields, checked against it by the handler.
ArraySpec = tuple[str, tuple[int, ...] | None, type]
INT, NUM = "iu", "iuf"
TIMEOUT: dict[str, Field] = {"timeout": (timeout, False)}
COMMON: dict[str, Field] = {"noreply": (flag, False)}


@dataclass(frozen=True)
class Operation:
    """One row of a server's table of operations: the one declaration that its dispatch,
    its request checks and ``docs/protocol.md`` read.

    Attributes:
        name: what a request's ``op`` names.
        handler: called as ``handler(operations, header, arrays)`` with the server's
            operations; returns ``(reply header, reply arrays)``, or a job when it ``parks``.
        headers: header field -> (check, required).
        arrays: array name -> (dtype kinds, ndims or None, error class).
        data: whether it also takes ``data/<field>`` arrays (checked by the handler).
        mutates: whether it may change a table (parked calls are retried after it).
        parks: whether a rate limiter (or a checkpoint under way) may hold it: it is then
            parked, and counts against the client's ``max_parked_per_client``.
    """

    name: str
    handler: Callable[[Any, dict, dict], Any]
    headers: Mapping[str, Field] = field(default_factory=dict)
    arrays: Mapping[str, ArraySpec] = field(default_factory=dict)
    data: bool = False
    mutates: bool = False
    parks: bool = False

    def check(self, header: dict, arrays: dict[str, np.ndarray]) -> None:
        """Check a decoded request of this operation: header fields (ints left as Python
        ints, so handlers may use them as they are) and arrays. Nothing is changed.

        Raises:
            ProtocolError: for a library-written field of the wrong type or range, or an
                array the operation does not take or of the wrong kind.
            InvalidArgumentError: for a user-given field (table, counts, timeout,
                priority) of the wrong type or range.
        """
        op = self.name
        for key, (check, required) in (*self.headers.items(), *COMMON.items()):
            if key in header:
                if header[key] is None and not required and check is not timeout:
                    continue
                check(header[key], key)
            elif required:
                raise ProtocolError(f"a {op!r} request needs the field {key!r}")
        for name, arr in (arrays or {}).items():
            spec = self.arrays.get(name)
            if spec is None:
                if self.data and name.startswith("data/"):
                    continue
                raise ProtocolError(
                    f"a {op!r} request carries no array {describe(name)}; it takes "
                    f"{sorted(self.arrays) + (['data/<field>'] if self.data else [])}"
                )
            kinds, ndims, error = spec
            if arr.dtype.kind not in kinds or (ndims is not None and arr.ndim not in ndims):
                raise error(
                    f"array {name!r} of a {op!r} request has dtype {arr.dtype} and shape "
                    f"{arr.shape}; it must be of kind {kinds!r} with ndim in {ndims}"
                )


def operation_of(header: dict, operations: Mapping[str, Operation]) -> Operation:
    """The operation a request names, checked with its fields and arrays (see
    :meth:`Operation.check`) before any handler runs.

    Raises:
        ProtocolError: for an operation ``operations`` does not hold.
    """
    op = header.get("op")
    operation = operations.get(op) if isinstance(op, str) else None
    if operation is None:
        raise ProtocolError(f"unknown operation {describe(op)}; operations: {sorted(operations)}")
    return operation
