"""The selector interface shared by samplers and removers.

A table holds its items in fixed slots ``0..capacity-1``. A selector keeps its own index
over the live slots and answers two questions: which slots to *sample* (sampler role)
and which slots to *evict* when the table is full (remover role). Every method is
batch-first and takes numpy arrays of slots (a single item is a batch of one) and, where
it takes priorities, a float64 array of one per slot or one float for all; none holds a
lock (the table does).
:class:`Selector` is the interface, a ``typing.Protocol``; the selectors here subclass
it for its default methods.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from rlreplay.errors import InvalidArgumentError


def check_parts(owner: Selector, state: Any, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse a selector state whose arrays are missing or not of ``shapes`` (name to
    the shape this bound selector keeps).

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
    """What a table's sampler or remover is. Implementations state the cost of each
    operation in their docstring; subclassing this class gives them its defaults.

    ``deterministic`` selectors (Fifo, Lifo, heaps) always pick the same slots for the
    same contents; random ones (Uniform, Prioritized) draw from ``rng``.
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
        """Delete held ``slots`` and insert them again as new items, in that order.

        A table calls this when new rows take over the slots of the items they overwrite;
        selectors whose index does not change in that case skip the work.
        """
        self.delete(slots)
        self.insert(slots, priorities)

    def move(self, old: int, new: int, priority: float) -> None:
        """The held item at ``old`` now lives at ``new`` (not held); order-keeping
        selectors keep its place, the others re-insert it."""
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
        """``n`` slots drawn with replacement and their selection probabilities.

        Deterministic selectors return their first slot ``n`` times with probability 1.
        """
        raise NotImplementedError

    def choose_victims(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """``k`` distinct held slots to evict (remover role)."""
        raise NotImplementedError

    def min_probability(self) -> float:
        """Smallest selection probability of any held slot (for importance weights); 0
        when :meth:`sample` has nothing to draw (no held item can be selected)."""
        raise NotImplementedError

    def state(self, into: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """A snapshot (copies) of the index as arrays and scalars, for checkpoints:
        :meth:`load_state` on a selector bound to the same capacity restores it exactly
        (the same picks for the same random draws). ``into``: arrays from
        :meth:`state_buffers` to copy into instead of allocating."""
        raise NotImplementedError

    def state_parts(self, into: dict[str, np.ndarray] | None) -> tuple[dict, list] | None:
        """:meth:`state` not filled yet, and how to fill it: ``(state, parts)``, each part
        ``(array, its copy in the state, slots per entry)``, where a change to slot ``s``
        changes at most entry ``s // slots_per_entry`` of the array (or a whole array
        of few entries). A checkpoint copies such a state in slices, then again the
        entries of the slots changed meanwhile (see :mod:`rlreplay.core.slot_changes`).
        ``None`` (the default): the state is taken whole, by :meth:`state`."""
        return None

    def state_buffers(self) -> dict[str, np.ndarray]:
        """Arrays :meth:`state` can copy into, allocated and written once here: a
        checkpoint makes them before it takes the table's lock, so that the copies under
        the lock write memory that is already mapped (first writes to fresh memory cost
        several times more)."""
        return {}

    def check_state(self, state: dict[str, Any]) -> None:
        """Check that ``state`` (what :meth:`state` returned) fits this bound selector,
        before anything is loaded: a restore checks every part first and then loads, so
        a state that does not fit changes nothing.

        Raises:
            InvalidArgumentError: naming the part that does not fit.
        """
        raise NotImplementedError

    def load_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state` returned, a state :meth:`check_state` accepts
        (the selector is bound to the same capacity)."""
        raise NotImplementedError

    def rebuild_order(self) -> np.ndarray:
        """The held slots in an order that rebuilds an equivalent index when inserted one
        after another into an empty selector (with their priorities): how a checkpoint
        moves items to other slots (a store of another capacity)."""
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
    """Base of the deterministic selectors (Fifo, Lifo, MinHeap, MaxHeap): they keep their
    items in one order, and sampling and eviction both take the front of it.

    Subclasses define :meth:`first`; sampling returns the first slot with probability 1,
    and the victims are the ``k`` first slots.
    """

    deterministic = True

    def first(self, k: int) -> np.ndarray:
        """The ``k`` first distinct slots, in selection order."""
        raise NotImplementedError

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The first slot ``n`` times, each with probability 1 (``rng`` is unused)."""
        return np.full(n, self.first(1)[0], dtype=np.int64), np.ones(n)

    def choose_victims(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """The ``k`` first slots, in order (``rng`` is unused)."""
        return self.first(k)

    def min_probability(self) -> float:
        """1: the one selectable slot is always selected (0 when none is held)."""
        return 1.0 if self.size else 0.0
