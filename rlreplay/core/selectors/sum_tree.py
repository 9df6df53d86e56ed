"""A wide (16-ary) float64 tree of sums or minima over a fixed number of leaves.

Why 16-ary: a sample descends ``log16(n)`` levels (5 at one million leaves instead of 20
for a binary tree), each level a vectorised gather of 16 contiguous float64 (two cache
lines) per draw, and the tree needs about ``n/15`` internal nodes instead of ``n``.

Parents are always recomputed from their children (never adjusted by deltas), so the
sums do not drift however many updates are applied.

Costs, for a batch of ``b`` leaves and ``n`` leaves in all: ``set`` and ``sample`` are
``O(b * 16 * log16 n)`` in a few numpy calls per level, ``total``/``root`` ``O(1)``.

Two implementations of ``set``, ``leaf_writer`` and ``find_prefix``: the compiled kernel
``rlreplay.core.selectors._sumtree`` (built from ``_sumtree.c`` by the package's install when a C
compiler is present; one C loop per batch, the GIL released) and the numpy path below, used
when the kernel is not built or when the environment variable ``RLREPLAY_NO_EXTENSION=1``
is set at import. Both give the same trees and the same picks up to floating-point rounding
at a range boundary; ``tests/test_sum_tree_kernel.py`` compares them.
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

    ``op="sum"``: every node is the sum of its children. ``op="min"``: every node is the
    smallest *positive* child (``inf`` when none is), so leaves of weight 0 (items never
    drawn) do not count. A min tree may be built over another tree's leaves
    (``leaves=sums.levels[0]``): it then stores only its internal nodes, and ``set(idx,
    None)`` recomputes the ancestors of leaves the other tree has just written.
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
        """Set leaves ``idx`` (duplicates: last wins) and recompute their ancestors;
        ``values=None`` leaves the leaves as they are (already written). ``mins``, a min
        tree over this sum tree's leaves, has its ancestors of ``idx`` recomputed too (in
        the same pass, with the kernel)."""
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
        # Parents are not deduplicated: a repeated parent gets the same value twice,
        # which costs less than finding the repeats. Small levels are recomputed whole.
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
        """An object whose ``set_many(idx, priorities, exponent)`` is :meth:`set` of
        ``priorities ** exponent`` at ``idx`` on this sum tree with ``mins`` (int64 and
        float64 arrays; one priority per index, or one for all): with the kernel a
        compiled ``_sumtree.LeafWriter`` that holds both trees' levels (so an insert or a
        priority update does not acquire them on every call, and raises the priorities
        to the exponent in the same loop), else :class:`LeafWriter`."""
        if self._kernel is not None and mins._kernel is not None and self.op == "sum":
            return self._kernel.LeafWriter(self.levels, mins.levels)
        return LeafWriter(self, mins)

    @staticmethod
    def _exact_children(children: np.ndarray, u: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Redo the child choice with sequential sums where the matrix product picked a
        zero-weight child (its sums may round differently at a boundary)."""
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
        The small upper levels (up to ``FLAT_LEVEL`` nodes) are searched in one step with a
        cumulative sum and ``searchsorted``; below that each level picks one of 16 children.
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
            # prefix[:, k] = sum of the first k children (k = 0..16), in one matrix product:
            # numpy's cumsum and counts along a 16-wide axis cost several times more.
            prefix = children @ _PREFIX
            # Rounding can leave u at or past the children's total: clamp it below the
            # total, so the pick is the last positive child, never a zero-weight one.
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
    """The numpy twin of the compiled ``_sumtree.LeafWriter`` (see
    :meth:`KaryTree.leaf_writer`): writes of a sum tree and its min tree."""

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
