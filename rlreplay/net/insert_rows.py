"""The rows of a pipelined insert, checked in this process before anything is taken.

A client inserting into a server's table learns the table's signature and limits once
(:class:`InsertPlan`, from ``describe``) and checks every call against them here, so a
call the table would refuse raises at the call, with the signature's own message, and
takes nothing. One row without a batch axis (a gymnasium loop's step) takes a fast path
that keeps its values as they are (array fields as bytes), to be coalesced with other
rows into one message (see :mod:`rlreplay.net.inserts`); anything else takes the general
path (:func:`batch_rows`), which converts or refuses with the signature's checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.specs import Signature
from rlreplay.errors import InvalidArgumentError
from rlreplay.net.payloads import rows_arrays

MAX_BATCH_ROWS = 1024  # rows coalesced into one message at most
MAX_BATCH_BYTES = 1 << 20  # bytes of row data in one coalesced message at most


class InsertPlan:
    """What a client needs to check and coalesce rows for one table (from ``describe``).

    Attributes:
        fields: ``(path, shape, dtype, scalar_check)`` per signature field.
        cap: most rows coalesced into one message for this table.
    """

    def __init__(self, name: str, desc: dict, max_message_bytes: int | None):
        self.name = name
        self.signature = Signature.from_json(desc["signature"])
        self.is_rows = bool(desc["is_rows"])
        self.max_size = int(desc["max_size"])
        self.lanes = int(desc.get("lanes", 1))
        self.fields = [
            (p, s.shape, s.dtype, _scalar_check(s.dtype) if not s.shape else None)
            for p, s in self.signature.fields.items()
        ]
        self.paths = set(self.signature.paths)
        row_bytes = max(1, self.signature.step_nbytes)
        limit = MAX_BATCH_BYTES
        if max_message_bytes is not None:
            limit = min(limit, max_message_bytes // 2)
        window = desc.get("insert_window")
        cap = min(MAX_BATCH_ROWS, self.max_size, max(1, limit // row_bytes))
        if window is not None:
            cap = min(cap, int(window))
        # a lane store takes whole rows of lanes only; single rows are never coalesced there
        self.cap = max(1, cap) if self.lanes == 1 else 0


def _scalar_check(dtype: np.dtype):
    """A fast test for a scalar field of ``dtype``: which Python and numpy scalar types
    the signature's casting rule admits unchanged (``None`` from the test: take the
    general path, which converts or refuses with the signature's own message)."""
    kind = dtype.kind
    numbers = (int, float, bool, np.bool_, np.integer, np.floating)  # never complex
    if kind == "b":
        return lambda v: type(v) is bool or type(v) is np.bool_
    if kind in "fc":
        # a Python int beyond 64 bits takes the general path (converted there or refused)
        return lambda v: isinstance(v, numbers) and (type(v) is not int or -(2**63) <= v < 2**63)
    info = np.iinfo(dtype)
    lo, hi = info.min, info.max

    def integer(v: Any) -> bool:
        t = type(v)
        if t is bool or t is np.bool_:
            return True
        return (t is int or isinstance(v, np.integer)) and lo <= v <= hi

    return integer


def single_row(plan: InsertPlan, rows: Any) -> list | None:
    """One row's values to hold (array fields as bytes), or None when ``rows`` is
    not one row without a batch axis (then :func:`batch_rows` checks it).

    Raises:
        SignatureError: for one row the table's signature refuses (nothing taken).
    """
    if type(rows) is not dict or rows.keys() != plan.paths:
        return _single_row_checked(plan, rows)
    values = []
    for path, shape, dtype, scalar_ok in plan.fields:
        v = rows[path]
        if shape:
            if type(v) is not np.ndarray or v.shape != shape or v.dtype != dtype:
                return _single_row_checked(plan, rows)
            values.append(v.tobytes())
        elif scalar_ok(v):
            values.append(v)
        elif type(v) is np.ndarray and v.shape == () and v.dtype == dtype:
            values.append(v[()])
        else:
            return _single_row_checked(plan, rows)
    return values


def _single_row_checked(plan: InsertPlan, rows: Any) -> list | None:
    """The general path for one row: the signature's own checks (and messages)."""
    if not isinstance(rows, Mapping):
        return None  # rows_arrays raises the signature's message
    first_path, _, _, _ = plan.fields[0]
    probe = rows.get(first_path) if "/" not in first_path else None
    if probe is None or np.ndim(probe) != len(plan.signature.fields[first_path].shape):
        return None  # a batch axis, or nested fields: the batch path
    flat = plan.signature.check_step(rows, "rows")
    values = []
    for path, shape, dtype, _ in plan.fields:
        arr = np.asarray(flat[path], dtype=dtype)
        values.append(arr.tobytes() if shape else arr[()])
    return values


def batch_rows(plan: InsertPlan, rows: Any, priorities: Any) -> tuple[dict, int]:
    """``(arrays, n)``: the wire arrays of a call's ``n`` rows (with ``priorities`` when
    given), checked against the table's signature and limits.

    Raises:
        SignatureError, InvalidArgumentError: for rows or priorities the table refuses.
    """
    arrays = rows_arrays(plan.signature, rows, plan.is_rows, plan.name)
    n = len(next(iter(arrays.values())))
    if n < 1 or n > plan.max_size or n % plan.lanes:
        raise InvalidArgumentError(
            f"rows hold {n} rows; insert between 1 and max_size={plan.max_size} at once"
            + (f", a multiple of the store's lanes={plan.lanes}" if plan.lanes > 1 else "")
        )
    if priorities is not None:
        arrays["priorities"] = check_priorities(priorities, n)
    return arrays, n
