"""Selectors: strategies that pick items, used as a table's sampler or remover."""

from rlreplay.core.selectors.base import Selector
from rlreplay.core.selectors.fifo import Fifo, Lifo
from rlreplay.core.selectors.heap import MaxHeap, MinHeap
from rlreplay.core.selectors.prioritized import Prioritized
from rlreplay.core.selectors.uniform import Uniform

SELECTORS = {cls.__name__: cls for cls in (Uniform, Prioritized, Fifo, Lifo, MinHeap, MaxHeap)}


def selector_from_config(config: dict) -> Selector:
    """Rebuild a selector from :meth:`Selector.config` output.

    Raises:
        InvalidArgumentError: for an unknown selector type, or keys it does not take.
    """
    from rlreplay.errors import InvalidArgumentError, check_keywords

    kind = config.get("type")
    if kind not in SELECTORS:
        raise InvalidArgumentError(
            f"selector type {kind!r} is unknown; choose one of {sorted(SELECTORS)}"
        )
    args = {k: v for k, v in config.items() if k != "type"}
    check_keywords(SELECTORS[kind], args, f"selector {kind}")
    return SELECTORS[kind](**args)


__all__ = [
    "SELECTORS",
    "Fifo",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "Prioritized",
    "Selector",
    "Uniform",
    "selector_from_config",
]
