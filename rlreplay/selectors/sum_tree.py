"""A wide (16-ary) float64 tree of sums or minima over a fixed number of leaves.

Why 16-ary: a sample descends ``log16(n)`` levels (5 at one million leaves instead of 20
for a binary tree), each level a vectorised gather of 16 contiguous float64 (two cache
lines) per draw, and the tree needs about ``n/15`` internal nodes instead of ``n``.

Parents are always recomputed from their children (never adjusted by deltas), so the
sums do not drift however many updates are applied.

Costs, for a batch of ``b`` leaves and ``n`` leaves in all: ``set`` and ``sample`` are
``O(b * 16 * log16 n)`` in a few numpy calls per level, ``total``/``root`` ``O(1)``.
"""

from __future__ import annotations

import numpy as np

FANOUT = 16


class KaryTree:
    """Reduction tree (``"sum"`` or ``"min"``) over ``size`` float64 leaves."""

    def __init__(self, size: int, op: str = "sum"):
        if op not in ("sum", "min"):
            raise ValueError(f"op={op!r} must be 'sum' or 'min'")
        self.size = int(size)
        self.op = op
        self.fill = 0.0 if op == "sum" else np.inf
        self.levels: list[np.ndarray] = []
        n = max(1, self.size)
        while True:
            padded = -(-n // FANOUT) * FANOUT
            self.levels.append(np.full(padded, self.fill))
            if n == 1:
                break
            n = padded // FANOUT
        self._reduce = np.sum if op == "sum" else np.min

    @property
    def leaves(self) -> np.ndarray:
        return self.levels[0][: self.size]

    @property
    def root(self) -> float:
        return float(self.levels[-1][0])

    def nbytes(self) -> int:
        return sum(level.nbytes for level in self.levels)

    def clear(self) -> None:
        for level in self.levels:
            level.fill(self.fill)

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``idx`` (duplicates: last wins) and recompute their ancestors."""
        if len(idx) == 0:
            return
        self.levels[0][idx] = values
        if len(idx) == 1:
            i = int(idx[0])
            for lower, upper in zip(self.levels, self.levels[1:]):
                i //= FANOUT
                base = i * FANOUT
                upper[i] = self._reduce(lower[base : base + FANOUT])
            return
        parents = np.unique(idx // FANOUT)
        for lower, upper in zip(self.levels, self.levels[1:]):
            upper[parents] = self._reduce(lower.reshape(-1, FANOUT)[parents], axis=1)
            parents = np.unique(parents // FANOUT)

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves."""
        for lower, upper in zip(self.levels, self.levels[1:]):
            upper[: len(lower) // FANOUT] = self._reduce(lower.reshape(-1, FANOUT), axis=1)

    def find_prefix(self, targets: np.ndarray) -> np.ndarray:
        """For a sum tree: the leaf whose cumulative range holds each target.

        ``targets`` must lie in ``[0, root)``. A leaf of zero weight is never returned.
        """
        idx = np.zeros(len(targets), dtype=np.int64)
        u = targets.astype(np.float64, copy=True)
        rows = np.arange(len(targets))
        for level in reversed(self.levels[:-1]):
            children = level.reshape(-1, FANOUT)[idx]
            csum = np.cumsum(children, axis=1)
            j = (csum <= u[:, None]).sum(axis=1)
            # Rounding can push u past the last positive child: clamp to that child.
            last_positive = FANOUT - 1 - np.argmax(children[:, ::-1] > 0, axis=1)
            j = np.minimum(j, last_positive)
            u -= np.where(j > 0, csum[rows, np.maximum(j - 1, 0)], 0.0)
            np.maximum(u, 0.0, out=u)
            idx = idx * FANOUT + j
        return idx
