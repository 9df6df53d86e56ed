"""Which rows of a step store changed since a checkpoint: the store's rows cut into chunks,
each stamped with the write generation of its last write.

A checkpoint writes each column of a store in files of ``chunk_rows`` rows and records the
write generation at its moment and the store's ``identity`` (its contents: new with every
store and whenever its columns are replaced). The next checkpoint of the same store reuses
the files of the chunks stamped no later (see :mod:`rlreplay.checkpoint.increments`).

The stamps are brought up to date when a checkpoint asks (:meth:`ChangedChunks.stamp`), not
by the writes: every write is at the store's head, so the steps written since the last
stamp are one range of ids, and the write paths pay nothing for this.
"""

from __future__ import annotations

import math
import uuid

import numpy as np

from rlreplay.core.specs import Signature

# Checkpoints write each column in files of ``chunk_rows`` rows (see
# :func:`checkpoint_chunk_rows`): about this many bytes of all columns per chunk, each
# chunk's bytes of each column a multiple of ``CHECKPOINT_CHUNK_ALIGN`` (a memory page)
# so that a memory-mapped restore can map the files of a column side by side.
CHECKPOINT_CHUNK_BYTES = 16 << 20
CHECKPOINT_CHUNK_ALIGN = 4096


def checkpoint_chunk_rows(signature: Signature, capacity: int) -> int:
    """Rows per checkpoint chunk of a store: about ``CHECKPOINT_CHUNK_BYTES`` of all its
    columns, a multiple of the fewest rows whose bytes are a multiple of
    ``CHECKPOINT_CHUNK_ALIGN`` in every column; ``capacity`` (one chunk) when that is
    not smaller."""
    unit = 1
    for spec in signature.fields.values():
        row = max(1, int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize)
        need = CHECKPOINT_CHUNK_ALIGN // math.gcd(row, CHECKPOINT_CHUNK_ALIGN)
        unit = unit * need // math.gcd(unit, need)
    rows = -(-max(1, CHECKPOINT_CHUNK_BYTES // max(1, signature.step_nbytes)) // unit) * unit
    return min(rows, capacity)


class ChangedChunks:
    """The write generation of each chunk of a store's rows, and the store's identity.

    Owned by a :class:`~rlreplay.core.storage.StepStore` (``store.changes``); every call is
    made with the store's lock held.

    Args:
        signature: the store's signature (sizes the chunks).
        capacity: the store's rows.

    Attributes:
        chunk_rows: rows per chunk (:func:`checkpoint_chunk_rows`).
        generations: per chunk, the write generation of its last stamped write.
        write_generation: the generation of the latest stamp.
        identity: the store's contents, as a hex string (new with replaced columns).
        stamped_to: steps before this id are stamped.
    """

    def __init__(self, signature: Signature, capacity: int):
        self.capacity = capacity
        self.chunk_rows = checkpoint_chunk_rows(signature, capacity)
        self.generations = np.zeros(-(-capacity // self.chunk_rows), np.int64)
        self.write_generation = 0
        self.identity = uuid.uuid4().hex
        self.stamped_to = 0

    def stamp(self, next_id: int) -> int:
        """Stamp the chunks of the steps written since the last call (ids
        ``[stamped_to, next_id)``, in ring order) with a new generation; returns the
        current write generation."""
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
        """The store's columns were replaced: a new identity, and every chunk stamped with a
        new generation (no chunk matches an earlier checkpoint)."""
        self.identity = uuid.uuid4().hex
        self.write_generation += 1
        self.generations[:] = self.write_generation
