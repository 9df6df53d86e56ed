"""The item index's per-slot records: their layout, the arrays holding them, their state.

One record per slot (generation, times sampled and, if kept, the priority) keeps a sampled
item's state in one cache line, in the layout the compiled loops take.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core.keys import make_keys, next_generation, next_generations
from rlreplay.core.selectors.base import copy_into, touched
from rlreplay.errors import InvalidArgumentError, describe

# Per-slot item state; the compiled loops rely on these layouts.
SLOT_STATE = np.dtype([("generation", "<u4"), ("times_sampled", "<u4"), ("priority", "<f8")])
SLOT_STATE_UNPRIORITIZED = np.dtype([("generation", "<u4"), ("times_sampled", "<u4")])
UNKEPT_PRIORITY = 1.0
"""What the priority of every item reads as in a table that keeps no priorities."""


def keeps_priorities(sampler: Any, remover: Any) -> bool:
    """Whether a table with these selectors keeps its items' priorities."""
    return getattr(sampler, "uses_priorities", True) or getattr(remover, "uses_priorities", True)


def slot_record_dtype(sampler: Any, remover: Any) -> np.dtype:
    """The per-slot record of a table with these selectors (16 or 8 bytes)."""
    return SLOT_STATE if keeps_priorities(sampler, remover) else SLOT_STATE_UNPRIORITIZED


class SlotRecords:
    """One record, one live flag and (``variable``) one extent per slot.

    Args:
        capacity: slots.
        record: :data:`SLOT_STATE`, or :data:`SLOT_STATE_UNPRIORITIZED`.
        variable: whether items have per-item extents.

    Arrays are allocated once and only written in place, so references to them stay current.
    """

    def __init__(self, capacity: int, record: np.dtype, variable: bool):
        self.capacity = capacity
        self.keeps_priorities = "priority" in record.names
        self.slot_state = np.zeros(capacity, dtype=record)
        if self.keeps_priorities:
            self.priority = self.slot_state["priority"]
        else:
            self.priority = np.broadcast_to(np.float64(UNKEPT_PRIORITY), (capacity,))
        self.generation = self.slot_state["generation"]
        self.times_sampled = self.slot_state["times_sampled"]
        self.slot_bytes = self.slot_state.view(np.uint8).reshape(capacity, record.itemsize)
        self.live = np.zeros(capacity, dtype=bool)
        self.extent = np.zeros(capacity, dtype=np.int32) if variable else None

    def live_in(self, start: int, n: int) -> np.ndarray:
        """Slots holding items among rows ``[start, start + n)`` (wrapping), in row order."""
        cap = self.capacity
        n = min(n, cap)
        end = start + n
        if end <= cap:
            return np.flatnonzero(self.live[start:end]) + start
        return np.concatenate(
            [np.flatnonzero(self.live[start:]) + start, np.flatnonzero(self.live[: end - cap])]
        )

    def any_live_in(self, start: int, n: int) -> bool:
        """Whether an item is anchored on rows ``[start, start + n)`` (wrapping)."""
        cap = self.capacity
        n = min(n, cap)
        end = start + n
        if end <= cap:
            return bool(self.live[start:end].any())
        return bool(self.live[start:].any() or self.live[: end - cap].any())

    def nbytes(self) -> int:
        """Bytes of the records and live flags."""
        return self.slot_state.nbytes + self.live.nbytes

    def claim(
        self,
        kernel: Any,
        slots: np.ndarray,
        prios: np.ndarray | None,
        fill: float,
        origin: int,
        start: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray | float]:
        """Write the records of new items at distinct ``slots``; returns ``(keys, priorities)``.

        ``kernel``: the compiled ``_slots`` loops, or ``None`` for the numpy twin.
        """
        n = len(slots)
        if kernel is None:
            at = slots if start is None else slice(start, start + n)
            generations = next_generations(self.generation[at])
            self.generation[at] = generations
            if self.keeps_priorities:
                self.priority[at] = fill if prios is None else prios
            self.times_sampled[at] = 0
            self.live[at] = True
            return make_keys(slots, generations, origin), (fill if prios is None else prios)
        keys = np.empty(n, dtype=np.int64)
        if prios is not None:
            prios = np.ascontiguousarray(prios, dtype=np.float64)
        if start is not None:
            kernel.claim_range(start, keys, self.slot_bytes, self.live, prios, fill, origin)
        else:
            slots = np.ascontiguousarray(slots, dtype=np.int64)
            kernel.claim_slots(slots, keys, self.slot_bytes, self.live, prios, fill, origin)
        return keys, (fill if prios is None else prios)

    def place_moved(self, slot: int, priority: float, times_sampled: int, span: int) -> None:
        """Write the record of an item moved to ``slot``, with a new generation."""
        self.generation[slot] = next_generation(int(self.generation[slot]))
        if self.keeps_priorities:
            self.priority[slot] = priority
        self.times_sampled[slot] = times_sampled
        if self.extent is not None:
            self.extent[slot] = span
        self.live[slot] = True

    def state(self, into: dict[str, Any]) -> dict[str, Any]:
        """Copies of the per-slot arrays, into ``into``'s buffers if given."""
        # One copy of the records' bytes; the fields are views of it.
        records = copy_into(self.slot_bytes, into, "records").reshape(-1)
        records = records.view(self.slot_state.dtype)
        if self.keeps_priorities:
            priority = records["priority"]
        else:  # the constant every priority reads as (a buffer filled outside the lock)
            priority = into.get("priority")
            if priority is None:
                priority = np.full(self.capacity, UNKEPT_PRIORITY)
        out: dict[str, Any] = {
            "priority": priority,
            "generation": records["generation"],
            "times_sampled": records["times_sampled"],
            "live": copy_into(self.live, into, "live"),
        }
        if self.extent is not None:
            out["extent"] = copy_into(self.extent, into, "extent")
        return out

    def state_parts(self, into: dict[str, Any]) -> tuple[dict[str, Any], list[tuple]]:
        """:meth:`state`'s arrays, not filled yet, and the parts that fill them."""
        records = into.get("records")
        if records is None:
            records = np.empty_like(self.slot_bytes)
        view = records.reshape(-1).view(self.slot_state.dtype)
        priority = view["priority"] if self.keeps_priorities else into.get("priority")
        if priority is None:
            priority = np.full(self.capacity, UNKEPT_PRIORITY)
        live = into.get("live")
        live = np.empty_like(self.live) if live is None else live
        out: dict[str, Any] = {
            "priority": priority,
            "generation": view["generation"],
            "times_sampled": view["times_sampled"],
            "live": live,
        }
        parts = [(self.slot_bytes, records, 1), (self.live, live, 1)]
        if self.extent is not None:
            extent = into.get("extent")
            out["extent"] = extent = np.empty_like(self.extent) if extent is None else extent
            parts.append((self.extent, extent, 1))
        return out, parts

    def state_buffers(self) -> dict[str, Any]:
        """Arrays :meth:`state` can copy into, made outside the table's lock."""
        out: dict[str, Any] = {
            "records": touched(self.slot_bytes.shape, np.uint8),
            "live": touched(self.live.shape, bool),
        }
        if not self.keeps_priorities:
            out["priority"] = np.full(self.capacity, UNKEPT_PRIORITY)
        if self.extent is not None:
            out["extent"] = touched(self.extent.shape, self.extent.dtype)
        return out

    def check_state(self, state: dict[str, Any]) -> None:
        """Check that ``state`` holds every per-slot array these records need.

        Raises:
            InvalidArgumentError: naming the first array missing or of the wrong size.
        """
        cap = self.capacity
        names = ["priority", "generation", "times_sampled", "live"]
        names += ["extent"] if self.extent is not None else []
        for name in names:
            arr = state.get(name)
            if not isinstance(arr, np.ndarray) or arr.shape != (cap,):
                raise InvalidArgumentError(
                    f"item state {name!r} is {describe(arr)}; this index needs an array of "
                    f"{cap} entries (one per slot)"
                )

    def load_state(self, state: dict[str, Any]) -> None:
        """Put back the arrays of a checked ``state``, in place."""
        if self.keeps_priorities:
            self.priority[:] = state["priority"]
        self.generation[:] = state["generation"]
        self.times_sampled[:] = state["times_sampled"]
        self.live[:] = state["live"]
        if self.extent is not None:
            self.extent[:] = state["extent"]
