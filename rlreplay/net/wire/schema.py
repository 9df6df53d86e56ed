"""Request schemas: every header field and array of each operation, checked in one place.

The server runs :func:`check_request` on every decoded request before any handler sees it,
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
from collections.abc import Callable
from typing import Any

import numpy as np

from rlreplay.errors import InvalidArgumentError, ProtocolError, describe

MAX_NAME = 1024  # longest table name accepted
MAX_TABLES = 64  # most tables one writer may name
MAX_COUNT = 2**31 - 1  # largest count (batch size, steps, history) a request may carry
MAX_STREAM = 2**62  # stream indices and sequence numbers stay below this


def _table(value: Any, key: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise InvalidArgumentError(
            f"{key}={describe(value)} must be a table name (a non-empty str)"
        )
    return value


def _count(value: Any, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise InvalidArgumentError(f"{key}={describe(value)} must be an int in [0, {MAX_COUNT}]")
    return value


def _size(value: Any, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise ProtocolError(f"request field {key!r} is {describe(value)}, not an int in [0, 2**31)")
    return value


def _timeout(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise InvalidArgumentError(
            f"{key}={describe(value)} must be a number of seconds > 0, or None to wait without "
            "limit; use can_insert()/can_sample() to check without waiting"
        )
    return value


def _priority(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidArgumentError(f"{key}={describe(value)} must be a number (finite, >= 0)")
    if not (math.isfinite(value) and value >= 0):
        raise InvalidArgumentError(f"{key}={describe(value)} must be finite and >= 0")
    return value


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"request field {key!r} is {describe(value)}, not a bool")
    return value


def _stream(value: Any, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_STREAM:
        raise ProtocolError(f"request field {key!r} is {describe(value)}, not an int in [0, 2**62)")
    return value


def _writer(value: Any, key: str) -> bytes | int:
    """A writer id: 16 random bytes (or, from older clients, an int below 2**64)."""
    if isinstance(value, bytes) and len(value) == 16:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64:
        return value
    raise ProtocolError(f"request field {key!r} is {describe(value)}, not a writer id")


def _names(value: Any, key: str) -> list[str]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_TABLES:
        raise InvalidArgumentError(
            f"{key}={describe(value)} must be a list of 1 to {MAX_TABLES} table names"
        )
    for name in value:
        _table(name, key)
    if len(set(value)) != len(value):
        twice = next(n for i, n in enumerate(value) if n in value[:i])
        raise InvalidArgumentError(
            f"{key}={describe(value)} repeats {twice!r}; name each of a writer's tables once "
            "(its items index this list, and a table holds one item per anchor step)"
        )
    return value


def _indices(value: Any, key: str) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_COUNT:
        raise ProtocolError(f"request field {key!r} is {describe(value)}, not a list of ints")
    for v in value:
        _stream(v, key)
    return value


Check = Callable[[Any, str], Any]
# Per operation: header field -> (check, required).
_TIMEOUT = {"timeout": (_timeout, False)}
HEADERS: dict[str, dict[str, tuple[Check, bool]]] = {
    "ping": {},
    "describe": {},
    "info": {"table": (_table, False)},
    "can_insert": {"table": (_table, True), "n": (_count, False)},
    "can_sample": {"table": (_table, True), "n": (_count, False)},
    "insert": {"table": (_table, True), "priority": (_priority, False), **_TIMEOUT},
    "sample": {
        "table": (_table, True),
        "batch_size": (_count, True),
        "shm": (_stream, False),
        **_TIMEOUT,
    },
    "sampler_state": {"table": (_table, True)},
    "update_priorities": {"table": (_table, True)},
    "delete": {"table": (_table, True)},
    "reset": {"table": (_table, True)},
    "write": {
        "writer": (_writer, True),
        "tables": (_names, True),
        "history": (_size, True),
        "seq": (_stream, False),
        "first": (_stream, True),
        "n": (_size, True),
        "episode_starts": (_indices, False),
        "restart": (_flag, False),
        **_TIMEOUT,
    },
    "close_writer": {"writer": (_writer, True)},
    "checkpoint": {**_TIMEOUT},
    # fields checked by rlreplay.net.server.shm, the one place that reads them
    "shm_attach": {},
    "shm_detach": {},
}
COMMON: dict[str, tuple[Check, bool]] = {"noreply": (_flag, False)}

# Per operation: array name -> (dtype kinds accepted, ndim accepted or None for any, error
# class). Keys and priorities come from a user's call: the table checks their shapes and
# values itself, and a wrong kind is that user's InvalidArgumentError. ``data/`` arrays are
# the signature's fields, checked against it by the handler.
_INT, _NUM = "iu", "iuf"
_USER, _LIB = InvalidArgumentError, ProtocolError
ARRAYS: dict[str, dict[str, tuple[str, tuple[int, ...] | None, type]]] = {
    "insert": {"priorities": (_NUM, None, _USER)},
    "sample": {"update/keys": (_INT, None, _USER), "update/priorities": (_NUM, None, _USER)},
    "sampler_state": {"update/keys": (_INT, None, _USER), "update/priorities": (_NUM, None, _USER)},
    "update_priorities": {"keys": (_INT, None, _USER), "priorities": (_NUM, None, _USER)},
    "delete": {"keys": (_INT, None, _USER)},
    "write": {
        "item_table": (_INT, (1,), _LIB),
        "item_anchor": (_INT, (1,), _LIB),
        "item_priority": (_NUM, (1,), _LIB),
        "item_length": (_INT, (1,), _LIB),
    },
}
WITH_DATA = {"insert", "write"}


def check_request(header: dict, arrays: dict[str, np.ndarray]) -> str:
    """Check a decoded request against its operation's schema; returns the operation.

    Header fields are checked (and ints left as Python ints), so handlers may use them
    as they are. Nothing is changed anywhere.

    Raises:
        ProtocolError: for an unknown operation, a library-written field of the wrong
            type or range, or an array the operation does not take or of the wrong kind.
        InvalidArgumentError: for a user-given field (table, counts, timeout, priority)
            of the wrong type or range.
    """
    op = header.get("op")
    fields = HEADERS.get(op) if isinstance(op, str) else None
    if fields is None:
        raise ProtocolError(f"unknown operation {describe(op)}; operations: {sorted(HEADERS)}")
    for key, (check, required) in (*fields.items(), *COMMON.items()):
        if key in header:
            if header[key] is None and not required and check is not _timeout:
                continue
            check(header[key], key)
        elif required:
            raise ProtocolError(f"a {op!r} request needs the field {key!r}")
    if arrays:
        allowed = ARRAYS.get(op, {})
        data = op in WITH_DATA
        for name, arr in arrays.items():
            spec = allowed.get(name)
            if spec is None:
                if data and name.startswith("data/"):
                    continue
                raise ProtocolError(
                    f"a {op!r} request carries no array {describe(name)}; it takes "
                    f"{sorted(allowed) + (['data/<field>'] if data else [])}"
                )
            kinds, ndims, error = spec
            if arr.dtype.kind not in kinds or (ndims is not None and arr.ndim not in ndims):
                raise error(
                    f"array {name!r} of a {op!r} request has dtype {arr.dtype} and shape "
                    f"{arr.shape}; it must be of kind {kinds!r} with ndim in {ndims}"
                )
    return op
