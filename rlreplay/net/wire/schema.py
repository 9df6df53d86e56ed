"""Request schemas: every header field and array of each operation, checked in one place,
before any handler runs. Unknown header keys are ignored; unknown arrays are refused.
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
# An array's accepted dtype kinds, ndim (None: any) and the error class for a wrong one.
ArraySpec = tuple[str, tuple[int, ...] | None, type]
INT, NUM = "iu", "iuf"
TIMEOUT: dict[str, Field] = {"timeout": (timeout, False)}
COMMON: dict[str, Field] = {"noreply": (flag, False)}


@dataclass(frozen=True)
class Operation:
    """One row of a server's table of operations (read by dispatch, checks and docs).

    Attributes:
        name: what a request's ``op`` names.
        handler: ``handler(operations, header, arrays)`` -> reply ``(header, arrays)`` or a job.
        headers: header field -> (check, required).
        arrays: array name -> (dtype kinds, ndims or None, error class).
        data: whether it also takes ``data/<field>`` arrays (checked by the handler).
        mutates: whether it may change a table (parked calls are retried after it).
        parks: whether it may be parked (counted in ``max_parked_per_client``).
    """

    name: str
    handler: Callable[[Any, dict, dict], Any]
    headers: Mapping[str, Field] = field(default_factory=dict)
    arrays: Mapping[str, ArraySpec] = field(default_factory=dict)
    data: bool = False
    mutates: bool = False
    parks: bool = False

    def check(self, header: dict, arrays: dict[str, np.ndarray]) -> None:
        """Check a decoded request of this operation, changing nothing.

        Raises:
            ProtocolError: for a library-written field of the wrong type or range, or an
                array the operation does not take or of the wrong kind.
            InvalidArgumentError: for a user-given field of the wrong type or range.
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
    """The operation a request names, checked (see :meth:`Operation.check`).

    Raises:
        ProtocolError: for an operation ``operations`` does not hold.
    """
    op = header.get("op")
    operation = operations.get(op) if isinstance(op, str) else None
    if operation is None:
        raise ProtocolError(f"unknown operation {describe(op)}; operations: {sorted(operations)}")
    return operation
