"""Uniform selection over the held slots."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core._compiled import load_kernel
from rlreplay.core.keys import has_duplicates
from rlreplay.core.selectors.base import Selector, copy_into, touched
from rlreplay.errors import InvalidArgumentError, describe

# sparse_delete: a batch delete in one call (None without the extension: the numpy path).
_kernel = load_kernel("rlreplay.core._slots")


class Uniform(Selector):
    """Every held item is equally likely.

    Index: a sparse set, 8 bytes per slot; every operation O(1) per slot, victims O(k).
    """

    name = "uniform"
    uses_priorities = False

    def bind(self, capacity: int) -> None:
        self.dense = np.zeros(capacity, dtype=np.int32)
        self.where = np.zeros(capacity, dtype=np.int32)
        self.size = 0

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        n = len(slots)
        self.dense[self.size : self.size + n] = slots
        self.where[slots] = np.arange(self.size, self.size + n, dtype=np.int32)
        self.size += n

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        pass

    def delete(self, slots: np.ndarray) -> None:
        k = len(slots)
        if _kernel is not None:
            slots = np.ascontiguousarray(slots, dtype=np.int64)
            self.size = _kernel.sparse_delete(self.dense, self.where, self.size, slots)
            return
        new_size = self.size - k
        positions = self.where[slots]
        in_tail = positions >= new_size
        holes = positions[~in_tail]
        # Tail entries that are not deleted move into the holes left by deleted ones.
        keep = np.ones(k, dtype=bool)
        keep[positions[in_tail] - new_size] = False
        keepers = self.dense[new_size : self.size][keep]
        self.dense[holes] = keepers
        self.where[keepers] = holes
        self.size = new_size

    def replace(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        pass  # the same slots stay held, and priorities do not matter

    def clear(self) -> None:
        self.size = 0

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        size = self.size
        # floor(u * size), u in [0, 1), is uniform and < size for size < 2**53; cheaper than
        # Generator.integers for small batches.
        picks = self.dense[(rng.random(n) * size).astype(np.intp)]
        probabilities = np.empty(n)
        probabilities.fill(1.0 / size)
        return picks, probabilities

    def choose_victims(self, k: int, rng: np.random.Generator) -> np.ndarray:
        if k == 1:
            return self.dense[rng.integers(0, self.size, size=1)]
        return self.dense[rng.choice(self.size, size=k, replace=False)]

    def min_probability(self) -> float:
        return 1.0 / self.size if self.size else 0.0

    def held(self) -> np.ndarray:
        return self.dense[: self.size].copy()

    def state(self, into: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """The held slots in draw order (``where`` follows from them)."""
        held = self.dense[: self.size]
        if into is not None and "dense" in into:
            return {"dense": copy_into(held, {"dense": into["dense"][: self.size]}, "dense")}
        return {"dense": held.copy()}

    def state_buffers(self) -> dict[str, np.ndarray]:
        return {"dense": touched(self.dense.shape, self.dense.dtype)}

    def rebuild_order(self) -> np.ndarray:
        return self.dense[: self.size].astype(np.int64)

    def check_state(self, state: dict[str, Any]) -> None:
        """The held slots: at most one per slot, each within capacity."""
        dense = state.get("dense") if isinstance(state, dict) else None
        capacity = len(self.dense)
        if (
            not isinstance(dense, np.ndarray)
            or dense.ndim != 1
            or dense.dtype.kind not in "iu"
            or len(dense) > capacity
            or (len(dense) and not 0 <= int(dense.min()) <= int(dense.max()) < capacity)
            or has_duplicates(dense, capacity)
        ):
            raise InvalidArgumentError(
                f"a Uniform state's 'dense' must hold distinct slots below {capacity}, got "
                f"{describe(dense)}: the state is of another capacity or another selector"
            )

    def load_state(self, state: dict[str, Any]) -> None:
        dense = np.asarray(state["dense"], dtype=np.int32)
        self.size = len(dense)
        self.dense[: self.size] = dense
        self.where[dense] = np.arange(self.size, dtype=np.int32)

    def nbytes(self) -> int:
        return self.dense.nbytes + self.where.nbytes
