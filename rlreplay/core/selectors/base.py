"""The selector interface shared by samplers and removers.

A selector keeps its own index over a table's live slots ``0..capacity-1`` and answers
which slots to *sample* and which to *evict*. Every method is batch-first (numpy arrays of
slots; priorities as a float64 array or one float); none holds a lock (the table does).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from rlreplay.errors import InvalidArgumentError


def check_parts(owner: Selector, state: Any, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse a selector state whose arrays are missing or not of ``shapes``.

    Raises:
        InvalidArgumentError: naming the selector, the part and both shapes.
    """
    name = type(owner).__name__
    if not isinstance(state, dict):
        raise InvalidArgumentError(
            f"a {name} state must be a dict of arrays, not {type(state).__name__}: it is "
            "not a selector's state"
        )
    for part, shape in shapes.items():
        got = state.get(part)
        if not isinstance(got, np.ndarray) or got.shape != shape:
            found = got.shape if isinstance(got, np.ndarray) else type(got).__name__
            raise InvalidArgumentError(
                f"a {name} state's {part!r} is {found}, this {name} keeps {shape}: the "
                "state is of another capacity or another selector"
            )


def touched(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An array whose memory has been written once (its pages are mapped)."""
    out = np.empty(shape, dtype)
    out.reshape(-1).view(np.uint8).fill(0)
    return out


def copy_into(source: np.ndarray, into: dict[str, np.ndarray] | None, name: str) -> np.ndarray:
    """A copy of ``source``: written into ``into[name]`` when there is one."""
    out = None if into is None else into.get(name)
    if out is None:
        return source.copy()
    np.copyto(out, source)
    return out


@runtime_checkable
class Selector(Protocol):
    """What a table's sampler or remover is; subclassing gives the default methods.

    ``deterministic`` selectors (Fifo, Lifo, heaps) always pick the same slots for the same
    contents; random ones (Uniform, Prioritized) draw from ``rng``.
    """

    deterministic: bool = False
    name: str = "selector"
    max_priority: float = float("inf")
    """The largest priority the bound selector takes (:class:`~rlreplay.Prioritized`: the
    largest whose ``priority ** priority_exponent`` over every slot sums to a finite
    float64); a table refuses larger ones before changing anything."""
    uses_priorities: bool = True
    """Whether the selector's choices depend on priorities; a table whose sampler and
    remover both ignore them keeps no priorities (see :class:`~rlreplay.core.item_index.
    ItemIndex`)."""

    def bind(self, capacity: int) -> None:
        """Allocate the index for ``capacity`` slots (called once by the table)."""
        raise NotImplementedError

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Add items (slots not currently held) with their priorities."""
        raise NotImplementedError

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Change the priorities of held slots (no duplicates)."""
        raise NotImplementedError

    def replace(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Delete held ``slots`` and insert them again as new items, in that order."""
        self.delete(slots)
        self.insert(slots, priorities)

    def move(self, old: int, new: int, priority: float) -> None:
        """The held item at ``old`` now lives at ``new`` (not held); order-keeping selectors
        keep its place in their order (stacks rely on it), others may re-insert it."""
        if old != new:
            self.delete(np.array([old], dtype=np.int64))
            self.insert(np.array([new], dtype=np.int64), np.array([priority]))

    def delete(self, slots: np.ndarray) -> None:
        """Remove held slots (no duplicates)."""
        raise NotImplementedError

    def clear(self) -> None:
        """Remove every slot."""
        raise NotImplementedError

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` slots drawn with replacement and their selection probabilities."""
        raise NotImplementedError

    def choose_victims(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """``k`` distinct held slots to evict (remover role)."""
        raise NotImplementedError

    def min_probability(self) -> float:
        """Smallest selection probability of any held slot; 0 when none can be drawn."""
        raise NotImplementedError

    def state(self, into: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """A snapshot (copies) of the index, for checkpoints; ``into``: arrays to copy into.
        :meth:`load_state` restores it exactly (the same picks for the same random draws)."""
        raise NotImplementedError

    def state_parts(self, into: dict[str, np.ndarray] | None) -> tuple[dict, list] | None:
        """``(state, parts)``, each part ``(array, its copy, slots per entry)``; ``None``: whole.
        Contract: a change to slot ``s`` changes only entry ``s // slots_per_entry`` of its array
        (checkpoints copy again only the entries of changed slots)."""
        return None

    def state_buffers(self) -> dict[str, np.ndarray]:
        """Arrays :meth:`state` can copy into, allocated and written once, outside the lock."""
        return {}

    def check_state(self, state: dict[str, Any]) -> None:
        """Check that ``state`` fits this bound selector, before anything is loaded.

        Raises:
            InvalidArgumentError: naming the part that does not fit.
        """
        raise NotImplementedError

    def load_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state` returned (same capacity)."""
        raise NotImplementedError

    def rebuild_order(self) -> np.ndarray:
        """The held slots in an order that rebuilds an equivalent index when inserted."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """Constructor arguments, to rebuild an equal selector."""
        return {"type": type(self).__name__}

    def nbytes(self) -> int:
        """Index memory in bytes."""
        return sum(v.nbytes for v in self.state().values() if isinstance(v, np.ndarray))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.config().items() if k != "type")
        return f"{type(self).__name__}({args})"


class OrderedSelector(Selector):
    """Base of the deterministic selectors: they define :meth:`first`, sampled and evicted first."""

    deterministic = True

    def first(self, k: int) -> np.ndarray:
        """The ``k`` first distinct slots, in selection order."""
        raise NotImplementedError

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The first slot ``n`` times, each with probability 1."""
        return np.full(n, self.first(1)[0], dtype=np.int64), np.ones(n)

    def choose_victims(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """The ``k`` first slots, in order."""
        return self.first(k)

    def min_probability(self) -> float:
        """1 (0 when no slot is held)."""
        return 1.0 if self.size else 0.0
