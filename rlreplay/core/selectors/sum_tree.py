"""A wide (16-ary) float64 tree of sums or minima over a fixed number of leaves.

Parents are always recomputed from their children, never adjusted by deltas, so sums do
not drift. The compiled ``_sumtree`` kernel and the numpy path give the same trees.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from rlreplay.core._compiled import load_kernel

_kernel = load_kernel("rlreplay.core.selectors._sumtree")

FANOUT = 16
FLAT_LEVEL = 8192  # levels up to this many nodes are searched in one step
WHOLE_LEVEL = 1024  # levels up to this many nodes are reduced whole on every set
# _PREFIX[i, k] = 1 where child i counts toward the sum of the first k children.
_PREFIX = np.triu(np.ones((FANOUT, FANOUT + 1)), k=1)
_ONES = np.ones(FANOUT)


def _min_positive(values: np.ndarray, axis: int | None = None, out=None) -> np.ndarray:
    """Minimum over the positive entries (``inf`` where there are none)."""
    return np.min(values, axis=axis, out=out, where=values > 0, initial=np.inf)


class KaryTree:
    """Reduction tree over ``size`` float64 leaves.

    ``op="sum"``: every node is the sum of its children. ``op="min"``: the smallest *positive*
    child (``inf`` if none). A min tree may share another tree's leaves
    (``leaves=sums.levels[0]``).
    """

    def __init__(
        self,
        size: int,
        op: str = "sum",
        use_kernel: bool | None = None,
        leaves: np.ndarray | None = None,
    ):
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
            # A min tree's root is always a reduction, never a raw leaf (which may be 0).
            if n == 1 and (op == "sum" or len(self.levels) > 1):
                break
            n = padded // FANOUT
        self.shares_leaves = leaves is not None
        if self.shares_leaves:
            if op != "min" or leaves.shape != self.levels[0].shape:
                raise ValueError("only a min tree shares leaves, with the sum tree's shape")
            self.levels[0] = leaves
        self._reduce = np.sum if op == "sum" else _min_positive
        if use_kernel and _kernel is None:
            raise ValueError("use_kernel=True but the compiled kernel is not available")
        self._kernel = _kernel if use_kernel is None or use_kernel else None
        if self._kernel is not None:
            self._kset = self._kernel.set_sum if op == "sum" else self._kernel.set_min

    @property
    def leaves(self) -> np.ndarray:
        return self.levels[0][: self.size]

    @property
    def root(self) -> float:
        return float(self.levels[-1][0])

    def _own_levels(self) -> list[np.ndarray]:
        return self.levels[1:] if self.shares_leaves else self.levels

    def nbytes(self) -> int:
        return sum(level.nbytes for level in self._own_levels())

    def clear(self) -> None:
        for level in self._own_levels():
            level.fill(self.fill)

    def set(
        self, idx: np.ndarray, values: np.ndarray | None, mins: KaryTree | None = None
    ) -> None:
        """Set leaves ``idx`` (last duplicate wins; ``None``: already written) and their ancestors.

        ``mins``, a min tree over these leaves, has its ancestors recomputed too.
        """
        n = len(idx)
        if n == 0:
            return
        levels = self.levels
        if self._kernel is not None and (mins is None or mins._kernel is not None):
            if values is not None:
                values = np.ascontiguousarray(values, dtype=np.float64)
                if values.shape != (n,):  # a scalar or a broadcastable shape, as numpy allows
                    values = np.ascontiguousarray(np.broadcast_to(values, (n,)))
            idx = np.ascontiguousarray(idx, dtype=np.int64)
            if mins is not None and len(mins.levels) == len(levels):
                self._kset(levels, idx, values, mins.levels)
                return
            self._kset(levels, idx, values)
            if mins is not None:  # a tree of one level: its min tree has one more
                mins.set(idx, None)
            return
        if mins is not None:
            self.set(idx, values)
            mins.set(idx, None)
            return
        if values is not None:
            levels[0][idx] = values
        # Repeated parents are recomputed twice, cheaper than deduplicating.
        parents = idx // FANOUT
        is_sum = self.op == "sum"
        for lower, upper in pairwise(levels):
            if len(lower) <= WHOLE_LEVEL:
                self._reduce(lower.reshape(-1, FANOUT), axis=1, out=upper[: len(lower) // FANOUT])
                continue
            children = np.take(lower.reshape(-1, FANOUT), parents, axis=0)
            upper[parents] = np.einsum("ij->i", children) if is_sum else _min_positive(children, 1)
            parents //= FANOUT

    def leaf_writer(self, mins: KaryTree) -> LeafWriter:
        """An object whose ``set_many(idx, priorities, exponent)`` sets ``priorities ** exponent``.

        With the kernel a compiled ``_sumtree.LeafWriter``, else :class:`LeafWriter`.
        """
        if self._kernel is not None and mins._kernel is not None and self.op == "sum":
            return self._kernel.LeafWriter(self.levels, mins.levels)
        return LeafWriter(self, mins)

    @staticmethod
    def _exact_children(children: np.ndarray, u: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Redo the child choice with sequential sums where a zero-weight child was picked."""
        bad = np.flatnonzero(children.ravel()[np.arange(len(j)) * FANOUT + j] == 0)
        csum = np.cumsum(children[bad], axis=1)
        u_bad = np.minimum(u[bad], np.nextafter(csum[:, -1], 0.0))
        last_positive = FANOUT - 1 - np.argmax(children[bad][:, ::-1] > 0, axis=1)
        j = j.copy()
        j[bad] = np.minimum((csum <= u_bad[:, None]).sum(axis=1), last_positive)
        return j

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves."""
        for lower, upper in zip(self.levels, self.levels[1:]):
            upper[: len(lower) // FANOUT] = self._reduce(lower.reshape(-1, FANOUT), axis=1)

    def find_prefix(self, targets: np.ndarray) -> np.ndarray:
        """For a sum tree: the leaf whose cumulative range holds each target.

        ``targets`` must lie in ``[0, root)``. A leaf of zero weight is never returned.
        """
        n = len(targets)
        levels = self.levels
        if self._kernel is not None and n:
            out = np.empty(n, dtype=np.int64)
            self._kernel.find_prefix(levels, np.ascontiguousarray(targets, dtype=np.float64), out)
            return out
        # The deepest level small enough to scan whole (the root level always is).
        top = len(levels) - 1
        while top > 0 and len(levels[top - 1]) <= FLAT_LEVEL:
            top -= 1
        u = targets.astype(np.float64, copy=True)
        if top == len(levels) - 1:
            idx = np.zeros(n, dtype=np.int64)
        else:
            cum = np.cumsum(levels[top])
            # Keep every target strictly below the total so it lands on a positive node.
            np.minimum(u, np.nextafter(cum[-1], 0.0), out=u)
            idx = np.searchsorted(cum, u, side="right")
            u -= np.where(idx > 0, cum[idx - 1], 0.0)
            np.maximum(u, 0.0, out=u)
        rows16 = np.arange(n, dtype=np.int64) * FANOUT
        rows17 = rows16 + np.arange(n, dtype=np.int64)
        for level in reversed(levels[:top]):
            children = np.take(level.reshape(-1, FANOUT), idx, axis=0)
            # prefix[:, k] = sum of the first k children, in one matrix product.
            prefix = children @ _PREFIX
            # Clamp u below the total (rounding) so a zero-weight child is never picked.
            np.minimum(u, np.nextafter(prefix[:, FANOUT], 0.0), out=u)
            j = ((prefix[:, 1:] <= u[:, None]) @ _ONES).astype(np.int64)
            if not children.ravel()[rows16 + j].all():
                j = self._exact_children(children, u, j)
            u -= prefix.ravel()[rows17 + j]
            np.maximum(u, 0.0, out=u)
            idx *= FANOUT
            idx += j
        return idx


class LeafWriter:
    """The numpy twin of the compiled ``_sumtree.LeafWriter``."""

    __slots__ = ("mins", "sums")

    def __init__(self, sums: KaryTree, mins: KaryTree):
        self.sums = sums
        self.mins = mins

    def set_many(self, idx: np.ndarray, priorities: np.ndarray, exponent: float) -> None:
        if len(priorities) not in (len(idx), 1):
            raise ValueError(
                f"set_many: priorities has {len(priorities)} items but idx has {len(idx)} "
                "(give one per index, or one for all)"
            )
        if len(idx) and not 0 <= idx.min() <= idx.max() < len(self.sums.levels[0]):
            raise ValueError(f"set_many: an index of {idx} is outside the leaves")
        values = priorities if exponent == 1.0 else np.power(priorities, exponent)
        self.sums.set(idx, values, self.mins)
