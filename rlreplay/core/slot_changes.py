"""The slots an item index changed while a checkpoint copied its per-slot state in slices.

A checkpoint copies the per-slot arrays a slice per lock hold, then, at its moment, copies
again the slots the index's mutations noted meanwhile. Invariant:
``index.changes.tracking`` is True exactly while a sliced copy is under way (outside it
the index holds :data:`UNTRACKED`). The record holds at most ``max(8 * LIST_LIMIT,
capacity)`` bytes: past ``LIST_LIMIT`` notes it turns into one flag per slot. Rule: every path
that changes per-slot state or selector entries (ItemIndex, DrawPlan) calls
``index.changes.note(slots)``, and a selector entry changes only with the slot it belongs to.
"""

from __future__ import annotations

import numpy as np

# Slots kept as a list (8 bytes per note) before the record turns into flags per slot.
LIST_LIMIT = 1 << 16


class Untracked:
    """The record an index holds outside a sliced copy: every note is dropped."""

    __slots__ = ()
    tracking = False
    everything = False

    def note(self, slots: np.ndarray) -> None:
        """Nothing to note."""

    def note_all(self) -> None:
        """Nothing to note."""


UNTRACKED = Untracked()
"""The one :class:`Untracked` record, held by every index no checkpoint copies now."""


class SlotChanges:
    """Slots noted by an index's mutations (lock held), and whether it changed whole.

    Args:
        capacity: the index's slots.
    """

    __slots__ = ("_arrays", "_noted", "capacity", "everything", "flags")
    tracking = True

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self._arrays: list[np.ndarray] = []
        self._noted = 0
        self.flags: np.ndarray | None = None  # one per slot, once past LIST_LIMIT notes
        self.everything = False  # a reset or a restore: every slot

    def note(self, slots: np.ndarray) -> None:
        """Slots of a batch mutation (copied: callers reuse their arrays)."""
        if self.flags is not None:
            self.flags[slots] = True
            return
        self._arrays.append(np.array(slots, dtype=np.int64).reshape(-1))
        self._noted += len(self._arrays[-1])
        if self._noted > LIST_LIMIT:
            self._to_flags()

    def note_all(self) -> None:
        self.everything = True

    def _to_flags(self) -> None:
        flags = np.zeros(self.capacity, dtype=bool)
        flags[self._listed()] = True
        self.flags, self._arrays = flags, []

    def _listed(self) -> np.ndarray:
        return np.concatenate([*self._arrays, np.zeros(0, dtype=np.int64)])

    @property
    def nbytes(self) -> int:
        """Bytes the record holds now."""
        if self.flags is not None:
            return self.flags.nbytes
        return 8 * self._noted

    def slots(self) -> np.ndarray:
        """Every slot noted, each once, sorted."""
        if self.flags is not None:
            return np.flatnonzero(self.flags)
        return sorted_unique(np.sort(self._listed()))


# A part of at most this many entries is copied whole at the moment.
WHOLE_ENTRIES = 1 << 16


def changed_entries(entries: int, per_entry: int, slots: np.ndarray | None) -> np.ndarray | None:
    """Entries of a part (``per_entry`` slots each) that a moment copies again; ``None``: all."""
    if slots is None or entries <= WHOLE_ENTRIES:
        return None
    return slots if per_entry == 1 else sorted_unique(slots // per_entry)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of sorted ``values``, without its slow first-call import of ``numpy.ma``."""
    if len(values) < 2:
        return values
    return values[np.concatenate(([True], values[1:] != values[:-1]))]
