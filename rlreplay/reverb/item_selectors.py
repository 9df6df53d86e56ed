"""Reverb's item selectors (``reverb.selectors``): which item a table samples or removes.

Each is a description that a :class:`~rlreplay.reverb.server.Table` turns into a fresh
rlreplay selector of its own (:meth:`build`), since a selector holds one table's index.
"""

from __future__ import annotations

import math
from typing import Any

import rlreplay as _rr
from rlreplay.errors import describe
from rlreplay.reverb.errors import InvalidArgumentError

__all__ = ["Fifo", "HeapSelector", "Lifo", "MaxHeap", "MinHeap", "Prioritized", "Uniform"]


class _Selector:
    option = ""  # the field of Reverb's KeyDistributionOptions it sets

    def build(self) -> Any:
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        return {self.option: True}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.options() == self.options()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.options().items()))))


class Uniform(_Selector):
    """Every item equally likely."""

    option = "uniform"

    def build(self) -> Any:
        return _rr.Uniform()


class Fifo(_Selector):
    """The oldest item first."""

    option = "fifo"

    def build(self) -> Any:
        return _rr.Fifo()


class Lifo(_Selector):
    """The newest item first."""

    option = "lifo"

    def build(self) -> Any:
        return _rr.Lifo()


class Prioritized(_Selector):
    """Items with probability ``priority ** priority_exponent / sum``.

    Raises:
        InvalidArgumentError (a ValueError): for an exponent that is not a finite number >= 0.
    """

    option = "prioritized"

    def __init__(self, priority_exponent: float):
        ok = isinstance(priority_exponent, (int, float)) and not isinstance(priority_exponent, bool)
        if not ok or not math.isfinite(priority_exponent) or priority_exponent < 0:
            raise InvalidArgumentError(
                f"priority_exponent={describe(priority_exponent)} must be a finite number >= 0"
            )
        self.priority_exponent = float(priority_exponent)

    def build(self) -> Any:
        return _rr.Prioritized(self.priority_exponent)

    def options(self) -> dict[str, Any]:
        return {"prioritized": {"priority_exponent": self.priority_exponent}}

    def __repr__(self) -> str:
        return f"Prioritized(priority_exponent={self.priority_exponent})"


class HeapSelector(_Selector):
    """The item of lowest (``min_heap=True``) or highest priority first."""

    option = "heap"

    def __init__(self, min_heap: bool):
        self.min_heap = bool(min_heap)

    def build(self) -> Any:
        return _rr.MinHeap() if self.min_heap else _rr.MaxHeap()

    def options(self) -> dict[str, Any]:
        return {"heap": {"min_heap": self.min_heap}}

    def __repr__(self) -> str:
        return "MinHeap()" if self.min_heap else "MaxHeap()"


class MinHeap(HeapSelector):
    """The item of lowest priority first."""

    def __init__(self) -> None:
        super().__init__(True)


class MaxHeap(HeapSelector):
    """The item of highest priority first."""

    def __init__(self) -> None:
        super().__init__(False)


def check_selector(argument: str, value: Any) -> _Selector:
    """``value`` if it is one of this module's selectors.

    Raises:
        InvalidArgumentError: naming ``argument`` otherwise.
    """
    if not isinstance(value, _Selector):
        raise InvalidArgumentError(
            f"{argument}={describe(value)} must be a selector of rlreplay.reverb.selectors "
            "(Uniform(), Prioritized(exponent), Fifo(), Lifo(), MinHeap(), MaxHeap())"
        )
    return value
