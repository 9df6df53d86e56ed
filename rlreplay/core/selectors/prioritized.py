"""Prioritized selection: P(i) = p_i**alpha / sum_j p_j**alpha."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core.selectors.base import Selector, check_parts, copy_into, touched
from rlreplay.core.selectors.sum_tree import FANOUT, KaryTree
from rlreplay.errors import EmptyTableError, InvalidArgumentError, describe

_ZERO = np.zeros(1)  # the priority of a deleted slot: never drawn
# Larger batches are raised to the exponent by numpy before the compiled tree write.
_RAISED_IN_NUMPY = 64


class Prioritized(Selector):
    """Samples in proportion to ``priority ** priority_exponent`` (PER's alpha).

    Index: a 16-ary sum tree plus a min tree, about 10 bytes per slot. Sample, insert, update
    and delete cost ``O(b * 16 * log16 n)`` for a batch of ``b``.

    Args:
        priority_exponent: alpha >= 0; 0 is uniform, 1 fully proportional.

    Raises:
        InvalidArgumentError: if ``priority_exponent`` is negative or not finite.

    Example:
        >>> sampler = Prioritized(priority_exponent=0.6)
    """

    name = "prioritized"

    def __init__(self, priority_exponent: float = 1.0):
        if (
            isinstance(priority_exponent, bool)
            or not isinstance(priority_exponent, (int, float, np.integer, np.floating))
            or not np.isfinite(priority_exponent)
            or priority_exponent < 0
        ):
            raise InvalidArgumentError(
                f"priority_exponent={describe(priority_exponent)} must be a finite number "
                ">= 0 (0 samples uniformly, 1 proportionally to priority)"
            )
        self.priority_exponent = float(priority_exponent)

    def bind(self, capacity: int) -> None:
        # A weight below float64's largest over 2 * capacity keeps every sum of leaves finite.
        if self.priority_exponent > 0:
            largest = float(np.finfo(np.float64).max) / (2 * max(capacity, 1))
            try:
                self.max_priority = largest ** (1.0 / self.priority_exponent)
            except OverflowError:  # an exponent below 1: every finite priority fits
                self.max_priority = float("inf")
        self.sums = KaryTree(capacity, "sum")
        # Over the sum tree's leaves: only its internal nodes cost memory and updates.
        self.mins = KaryTree(capacity, "min", leaves=self.sums.levels[0])
        # Inserts, updates and deletes: one call raises to the exponent and fixes both trees.
        self.leaf_writer = self.sums.leaf_writer(self.mins)
        self.held = np.zeros(capacity, dtype=bool)
        self.size = 0

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.update(slots, priorities)
        self.held[slots] = True
        self.size += len(slots)

    def update(self, slots: np.ndarray, priorities: np.ndarray | float) -> None:
        if len(slots) == 0:
            return
        p = np.ascontiguousarray(priorities, dtype=np.float64)  # one per slot, or one for all
        exponent = self.priority_exponent
        if exponent != 1.0 and len(p) > _RAISED_IN_NUMPY:
            p, exponent = np.power(p, exponent), 1.0  # numpy's vector power: faster here
        # Items of weight 0 are never sampled; the min tree skips them.
        self.leaf_writer.set_many(np.ascontiguousarray(slots, dtype=np.int64), p, exponent)

    def replace(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.update(slots, priorities)  # held stays set and the size unchanged

    def delete(self, slots: np.ndarray) -> None:
        self.leaf_writer.set_many(np.ascontiguousarray(slots, dtype=np.int64), _ZERO, 1.0)
        self.held[slots] = False
        self.size -= len(slots)

    def clear(self) -> None:
        self.sums.clear()
        self.mins.clear()
        self.held.fill(False)
        self.size = 0

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        total = self.sums.root
        if not total > 0:
            raise EmptyTableError(
                "every item has priority 0, so prioritized sampling has nothing to draw "
                "from; give items positive priorities (e.g. |td_error| + 1e-6)"
            )
        slots = self.sums.find_prefix(rng.random(n) * total)
        return slots, self.sums.levels[0][slots] / total

    def choose_victims(self, k: int, rng: np.random.Generator) -> np.ndarray:
        chosen = []
        saved = []
        for _ in range(k):  # without replacement: zero each pick before the next draw
            s = int(self.sample(1, rng)[0][0]) if self.sums.root > 0 else self._any_zero(chosen)
            chosen.append(s)
            saved.append(self.sums.levels[0][s])
            self.sums.set(np.array([s]), np.zeros(1))
        self.sums.set(np.array(chosen), np.array(saved))
        return np.array(chosen, dtype=np.int64)

    def _any_zero(self, chosen: list[int]) -> int:
        """The first held slot of weight 0 not already chosen."""
        candidates = self.held & (self.sums.leaves == 0.0)
        candidates[chosen] = False
        return int(np.flatnonzero(candidates)[0])

    def min_probability(self) -> float:
        total = self.sums.root
        return self.mins.root / total if total > 0 and np.isfinite(self.mins.root) else 0.0

    def probabilities(self, slots: np.ndarray) -> np.ndarray:
        return self.sums.levels[0][slots] / self.sums.root

    def state(self, into: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """Every node of both trees (copies, so sums restore exactly) and the held flags."""
        into = into or {}
        return {
            "sums": np.concatenate(self.sums.levels, out=into.get("sums")),
            "mins": np.concatenate(self.mins.levels[1:], out=into.get("mins")),
            "held": copy_into(self.held, into, "held"),
        }

    def state_parts(self, into: dict[str, np.ndarray] | None) -> tuple[dict, list]:
        """:meth:`state`'s arrays as parts (slot ``s``: entry ``s // 16**level``)."""
        into = into or {}
        sums = into.get("sums")
        if sums is None:
            sums = np.empty(sum(len(v) for v in self.sums.levels))
        mins = into.get("mins")
        if mins is None:
            mins = np.empty(sum(len(v) for v in self.mins.levels[1:]))
        held = into.get("held")
        held = np.empty_like(self.held) if held is None else held
        parts = []
        for flat, levels, first in ((sums, self.sums.levels, 0), (mins, self.mins.levels, 1)):
            at = 0
            for level, nodes in enumerate(levels[first:], start=first):
                parts.append((nodes, flat[at : at + len(nodes)], FANOUT**level))
                at += len(nodes)
        parts.append((self.held, held, 1))
        return {"sums": sums, "mins": mins, "held": held}, parts

    def state_buffers(self) -> dict[str, np.ndarray]:
        sums = sum(len(v) for v in self.sums.levels)
        mins = sum(len(v) for v in self.mins.levels[1:])
        return {
            "sums": touched((sums,), np.float64),
            "mins": touched((mins,), np.float64),
            "held": touched(self.held.shape, bool),
        }

    def rebuild_order(self) -> np.ndarray:
        return np.flatnonzero(self.held)

    def check_state(self, state: dict[str, Any]) -> None:
        shapes = {
            "sums": (sum(len(v) for v in self.sums.levels),),
            "mins": (sum(len(v) for v in self.mins.levels[1:]),),
            "held": self.held.shape,
        }
        check_parts(self, state, shapes)

    def load_state(self, state: dict[str, Any]) -> None:
        sums, mins = state["sums"], state["mins"]
        sum_levels, min_levels = self.sums.levels, self.mins.levels[1:]
        for levels, flat in ((sum_levels, sums), (min_levels, mins)):
            at = 0
            for level in levels:
                level[:] = flat[at : at + len(level)]
                at += len(level)
        self.held[:] = state["held"]
        self.size = int(np.count_nonzero(self.held))

    def config(self) -> dict[str, Any]:
        return {"type": "Prioritized", "priority_exponent": self.priority_exponent}

    def nbytes(self) -> int:
        return self.sums.nbytes() + self.mins.nbytes() + self.held.nbytes
