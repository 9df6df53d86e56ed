"""Memory fit: refuse, before allocating, a store or table that cannot fit in memory.

numpy allocates lazily, so an oversized buffer would be killed hours later as it fills;
:func:`check_fits` refuses it at construction instead. See docs/tables.md.
"""

from __future__ import annotations

import copy
import math
import os
import threading
import weakref
from typing import Any

import numpy as np

from rlreplay.errors import InsufficientMemoryError, InvalidArgumentError, describe

CHECKED_BYTES = 1 << 20  # smaller configurations are not checked
PROBE_SLOTS = 4096  # slots a selector copy is bound to when its bytes per slot are measured

_promised = 0  # bytes promised to live stores and indexes of this process
_promised_lock = threading.Lock()


def _meminfo() -> dict[str, int]:
    """Fields of ``/proc/meminfo`` in bytes (empty where it cannot be read)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                name, _, rest = line.partition(b":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    scale = 1024 if len(parts) > 1 and parts[1] == b"kB" else 1
                    out[name.decode()] = int(parts[0]) * scale
    except OSError:
        pass
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_left() -> int | None:
    """Bytes a cgroup memory limit still leaves this process (None: no limit known)."""
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < 1 << 60:
            return max(0, limit - usage)
    return None


def _resident_bytes() -> int:
    """This process's resident set size in bytes (0 where unknown)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def available_bytes() -> int | None:
    """Bytes a new store or table may still use; ``None`` where the system does not say."""
    info = _meminfo()
    avail = info.get("MemAvailable")
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    left = _cgroup_left()
    if left is not None:
        avail = min(avail, left)
    with _promised_lock:
        promised = _promised
    untouched = max(0, promised - _resident_bytes())
    return max(0, avail - untouched)


def _release(nbytes: int) -> None:
    global _promised
    with _promised_lock:
        _promised -= nbytes


def check_fits(owner: Any, nbytes: int, what: str, fix: str) -> None:
    """Refuse ``nbytes`` for ``what`` when it cannot fit; else count it while ``owner`` lives.

    Args:
        owner: the object the memory belongs to (weakly referenced), or None to check only.
        nbytes: bytes the configuration allocates.
        what: the configuration, for the message.
        fix: what the user may change (e.g. ``"lower capacity="``).

    Raises:
        InsufficientMemoryError: when ``nbytes`` exceeds :func:`available_bytes`; nothing
            was allocated or counted.
    """
    global _promised
    if nbytes < CHECKED_BYTES:
        return
    avail = available_bytes()
    if avail is not None and nbytes > avail:
        raise InsufficientMemoryError(
            f"{what} needs {format_bytes(nbytes)} ({nbytes} bytes) but this machine has "
            f"{format_bytes(avail)} ({avail} bytes) available (MemAvailable, less what this "
            f"process's other stores and tables already promised): it would be killed once "
            f"the buffer fills; {fix}",
            needed_bytes=nbytes,
            available_bytes=avail,
        )
    if owner is not None:
        with _promised_lock:
            _promised += nbytes
        weakref.finalize(owner, _release, nbytes)


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it >= 1 (``"1.50 GiB"``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # not reached


def index_slot_bytes(sampler: Any, remover: Any, variable: bool, evicts: bool = True) -> float:
    """Bytes per slot of a table's item index, measured on a small :class:`ItemIndex`."""
    from rlreplay.core.item_index import ItemIndex

    probe = ItemIndex(
        PROBE_SLOTS,
        copy.copy(sampler),
        copy.copy(remover),
        PROBE_SLOTS // 2 if evicts else PROBE_SLOTS,
        span=1,
        variable=variable,
        default_priority=None,
        rng=np.random.default_rng(0),
    )
    arrays = (probe.slot_state, probe.live, probe.extent)
    total = sum(a.nbytes for a in arrays if a is not None) + probe.sampler.nbytes()
    if getattr(probe, "remover_active", True):
        total += probe.remover.nbytes()
    return total / PROBE_SLOTS


def check_index(
    owner: Any, capacity: int, sampler: Any, remover: Any, variable: bool, max_size: int
) -> None:
    """:func:`check_fits` for the item index of table ``owner`` over ``capacity`` slots.

    Raises:
        InsufficientMemoryError: naming the table, its slots and bytes per slot.
    """
    if capacity * 128 < CHECKED_BYTES:
        return
    per_slot = index_slot_bytes(sampler, remover, variable, max_size < capacity)
    check_fits(
        owner,
        math.ceil(capacity * per_slot),
        f"the item index of table {owner.name!r} ({capacity} slots of {per_slot:.1f} bytes: "
        f"{type(sampler).__name__} sampler, {type(remover).__name__} remover)",
        "lower the store's capacity, or give the table capacity_bytes= (a byte budget for "
        "its store and index, resolved to steps)",
    )


def table_rows(
    signature: Any,
    capacity: Any,
    store: Any,
    capacity_bytes: Any,
    sampler: Any,
    remover: Any,
    layout: Any,
    max_size: Any,
) -> int:
    """The capacity a table's own store gets from ``capacity_bytes`` (columns and index slots).

    Raises:
        InvalidArgumentError: with ``capacity=`` or ``store=`` also given, without
            ``signature=``, or for a ``capacity_bytes`` too small for one step.
        InsufficientMemoryError: for a ``capacity_bytes`` larger than the memory available.
    """
    from rlreplay.core.selectors import Fifo, Selector, Uniform
    from rlreplay.core.specs import Signature

    if capacity is not None or store is not None or signature is None:
        raise InvalidArgumentError(
            "capacity_bytes= sizes the table's own store: give it with signature= and "
            "without capacity= or store= (a shared store takes its own capacity_bytes=)"
        )
    if isinstance(sampler, type) or not isinstance(sampler, Selector):
        sampler = Uniform()
    if isinstance(remover, type) or not isinstance(remover, Selector):
        remover = Fifo()
    variable = bool(getattr(layout, "variable", False))
    per_slot = index_slot_bytes(sampler, remover, variable, max_size is not None)
    row_bytes = Signature(signature).step_nbytes + per_slot
    rows = rows_for_bytes(capacity_bytes, row_bytes, 1, "capacity_bytes")
    check_fits(  # checked here too, so that the message names the argument given
        None,
        math.ceil(rows * row_bytes),
        f"a table of {rows} steps of {row_bytes:.1f} bytes (columns and item index)",
        f"lower capacity_bytes={capacity_bytes} to what is available",
    )
    return rows


def rows_for_bytes(capacity_bytes: Any, row_bytes: float, lanes: int, name: str) -> int:
    """The most rows (a multiple of ``lanes``) of ``row_bytes`` each within ``capacity_bytes``.

    Raises:
        InvalidArgumentError: for a ``capacity_bytes`` that is not a positive int, or one
            too small for ``lanes`` rows.
    """
    if (
        not isinstance(capacity_bytes, (int, np.integer))
        or isinstance(capacity_bytes, bool)
        or capacity_bytes < 1
    ):
        raise InvalidArgumentError(
            f"{name}={describe(capacity_bytes)} must be a positive int: the bytes the "
            "buffer may take, resolved to the most rows that fit"
        )
    rows = int(capacity_bytes // max(row_bytes, 1))
    rows -= rows % lanes
    rows = min(rows, (2**31 - 1) // lanes * lanes)
    if rows < lanes:
        raise InvalidArgumentError(
            f"{name}={capacity_bytes} holds no row: one row takes {row_bytes:g} bytes"
            + (f" and the store has lanes={lanes}" if lanes > 1 else "")
            + f"; give at least {math.ceil(row_bytes * lanes)} bytes"
        )
    return rows
