"""The requests of a client's table calls that carry arrays: an insert, a sample
with its optional priority update, and the plain values their headers hold.

They are checked here, in the caller's process, before anything is sent, so a call the
server would refuse for its form raises at once and sends nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.net.client.served_tables import ServedTables
from rlreplay.net.wire.payloads import rows_arrays, update_arrays


def insert_request(
    tables: ServedTables, table: str, rows: Mapping[str, Any], priorities: Any, until: Any
) -> tuple[dict, dict]:
    """``(header, arrays)`` of an insert of ``rows`` into ``table``, checked against its
    signature (its description fetched, once, within ``until``).

    Raises:
        SignatureError, InvalidArgumentError: for rows or priorities the table refuses,
            or a table the server does not serve.
    """
    sig = tables.signature(table, until)
    arrays = rows_arrays(sig, rows, tables.describe(table, until)["is_rows"], table)
    header: dict[str, Any] = {"op": "insert", "table": table}
    if priorities is not None:
        n = len(next(iter(arrays.values())))
        arrays["priorities"] = check_priorities(priorities, n)
    return header, arrays


def sample_request(table: str, batch_size: Any, update: Any) -> tuple[dict, dict]:
    """``(header, arrays)`` of a sample of ``batch_size`` items (the server checks it),
    carrying ``update`` (``(keys, priorities)`` or ``None``).

    Raises:
        InvalidArgumentError: if ``update`` is not such a pair, or its keys are not
            integers or its priorities not numbers.
    """
    header = {"op": "sample", "table": table, "batch_size": plain_int(batch_size)}
    if update is None:
        return header, {}
    if not isinstance(update, tuple) or len(update) != 2:
        raise InvalidArgumentError(
            f"update={describe(update)} must be a (keys, priorities) pair or None"
        )
    return header, update_arrays(*update, prefix="update/")


def plain_int(value: Any) -> Any:
    """A numpy integer as a Python int (what the wire carries); anything else unchanged,
    for the server to check."""
    return int(value) if isinstance(value, np.integer) else value
