"""Client-side request and reply payloads: rows and priority updates become named wire
arrays, and sample replies become :class:`~rlreplay.Sample` objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.sample import Sample, SampleInfo
from rlreplay.core.specs import Signature
from rlreplay.errors import InvalidArgumentError, describe


def as_sample(header: dict, arrays: dict) -> Sample:
    data = {k[5:]: v for k, v in arrays.items() if k.startswith("data/")}
    info = SampleInfo(
        arrays["keys"],
        arrays["probabilities"],
        arrays["priorities"],
        arrays["times_sampled"],
        int(header["table_size"]),
        float(header["min_probability"]),
    )
    return Sample(data, info)


def rows_arrays(sig: Signature, rows: Mapping[str, Any], is_rows: bool, table: str) -> dict:
    """Validate rows client-side (the server checks again) and name them for the wire."""
    if not is_rows:
        raise InvalidArgumentError(
            f"table {table!r} has items spanning several steps; insert() stores one row per "
            "item, so append steps with a trajectory writer instead"
        )
    if sig.row_count(rows)[0]:
        flat = {p: a[None] for p, a in sig.check_step(rows, "rows").items()}
    else:
        flat, _ = sig.check_batch(rows, "rows")
    return {"data/" + p: a.astype(sig.fields[p].dtype, copy=False) for p, a in flat.items()}


def update_arrays(keys: Any, priorities: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """The arrays of a priority update, named ``prefix + "keys"`` and ``prefix +
    "priorities"`` (the server checks them fully).

    Raises:
        InvalidArgumentError: if ``keys`` are not integers or ``priorities`` not numbers.
    """
    k = np.asarray(keys)
    if k.size == 0:
        k = k.astype(np.int64)
    if k.dtype.kind not in "iu":
        raise InvalidArgumentError(
            f"keys must be a 1-d array of int64 item keys (as in Sample.info.keys), got "
            f"{describe(keys)}"
        )
    try:
        p = np.asarray(priorities, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"priorities={describe(priorities)} must be a number or a 1-d array of numbers"
        ) from None
    return {prefix + "keys": k, prefix + "priorities": p}


def checked_update(keys: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
    """A priority update checked as far as a client can without the table (``keys`` 1-d
    integers; ``priorities`` finite, >= 0, one per key or one for all).

    Returns:
        ``(keys, priorities)`` as int64 and float64 arrays of equal length.

    Raises:
        InvalidArgumentError: otherwise, as :meth:`Table.update_priorities` would.
    """
    arrays = update_arrays(keys, priorities)
    k = arrays["keys"].reshape(-1) if arrays["keys"].ndim == 0 else arrays["keys"]
    if k.ndim != 1:
        raise InvalidArgumentError(
            f"keys must be a 1-d array of int64 item keys, got shape {k.shape}"
        )
    return k.astype(np.int64, copy=False), check_priorities(arrays["priorities"], len(k))
