"""The slots an item index changed while a checkpoint copied its per-slot state in slices.

A checkpoint of a table of many items copies its per-slot arrays (records, live flags,
extents, a prioritized sampler's trees) a slice per lock hold, so that no table call
waits for the whole copy, then takes its moment in one last short hold. For the copy to
be the state at that moment, the slots changed meanwhile are copied again in that hold.
The item index knows them: while :attr:`ItemIndex.changes
<rlreplay.core.item_slots.ItemIndex.changes>` holds a :class:`SlotChanges`, each of its
mutation paths (items made, removed, evicted, moved, priorities set, draws counted, a
reset) notes the slots it touches. One mechanism, in the index's own mutation paths: a
selector's entries change only with the slot they belong to (the sum tree: the leaf and
its ancestors), so the slots say what to copy again. Outside a checkpoint the paths pay
one attribute check.
"""

from __future__ import annotations

import numpy as np


class SlotChanges:
    """Slots noted by an index's mutations (lock held), and whether it changed whole."""

    __slots__ = ("_arrays", "_ones", "everything")

    def __init__(self) -> None:
        self._arrays: list[np.ndarray] = []
        self._ones: list[int] = []
        self.everything = False  # a reset or a restore: every slot

    def note(self, slots: np.ndarray) -> None:
        """Slots of a batch mutation (copied: callers reuse their arrays)."""
        self._arrays.append(np.array(slots, dtype=np.int64).reshape(-1))

    def note_one(self, slot: int) -> None:
        self._ones.append(int(slot))

    def note_all(self) -> None:
        self.everything = True

    def slots(self) -> np.ndarray:
        """Every slot noted, each once, sorted."""
        parts = [*self._arrays, np.array(self._ones, dtype=np.int64)]
        return sorted_unique(np.sort(np.concatenate(parts)))


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of sorted ``values``, without ``np.unique``'s first-call import of
    ``numpy.ma`` (5-15 ms, too long for a checkpoint's moment under the store's lock)."""
    if len(values) < 2:
        return values
    return values[np.concatenate(([True], values[1:] != values[:-1]))]
