"""Which rows of a step store changed since a checkpoint, by chunk and write generation.

The next checkpoint of a store reuses the files of chunks stamped no later than the last
one (see :mod:`rlreplay.checkpoint.increments`); writes pay nothing for the stamps.
"""

from __future__ import annotations

import math
import uuid

import numpy as np

from rlreplay.core.specs import Signature

# About this many bytes of all columns per chunk; each column's chunk is page-aligned so
# a memory-mapped restore can map a column's files side by side.
CHECKPOINT_CHUNK_BYTES = 16 << 20
CHECKPOINT_CHUNK_ALIGN = 4096


def checkpoint_chunk_rows(signature: Signature, capacity: int) -> int:
    """Rows per checkpoint chunk: about ``CHECKPOINT_CHUNK_BYTES``, aligned in every column."""
    unit = 1
    for spec in signature.fields.values():
        row = max(1, int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize)
        need = CHECKPOINT_CHUNK_ALIGN // math.gcd(row, CHECKPOINT_CHUNK_ALIGN)
        unit = unit * need // math.gcd(unit, need)
    rows = -(-max(1, CHECKPOINT_CHUNK_BYTES // max(1, signature.step_nbytes)) // unit) * unit
    return min(rows, capacity)


class ChangedChunks:
    """The write generation of each chunk of a store's rows, and the store's identity.

    Owned by a :class:`~rlreplay.core.storage.StepStore`; every call holds the store's lock.

    Args:
        signature: the store's signature (sizes the chunks).
        capacity: the store's rows.
    """

    def __init__(self, signature: Signature, capacity: int):
        self.capacity = capacity
        self.chunk_rows = checkpoint_chunk_rows(signature, capacity)
        self.generations = np.zeros(-(-capacity // self.chunk_rows), np.int64)
        self.write_generation = 0
        self.identity = uuid.uuid4().hex
        self.stamped_to = 0

    def stamp(self, next_id: int) -> int:
        """Stamp the chunks written since the last call with a new generation; return it."""
        n = next_id - self.stamped_to
        if n > 0:
            g = self.write_generation = self.write_generation + 1
            cr, capacity = self.chunk_rows, self.capacity
            start = self.stamped_to % capacity
            end = start + n
            if n >= capacity:
                self.generations[:] = g
            elif end <= capacity:
                self.generations[start // cr : (end - 1) // cr + 1] = g
            else:
                self.generations[start // cr :] = g
                self.generations[: (end - capacity - 1) // cr + 1] = g
        self.stamped_to = next_id
        return self.write_generation

    def replaced(self) -> None:
        """The columns were replaced: a new identity, and every chunk stamped anew."""
        self.identity = uuid.uuid4().hex
        self.write_generation += 1
        self.generations[:] = self.write_generation
