"""The names of Reverb's compiled ``reverb.pybind`` module that Python code refers to,
bound to this package's pure-Python classes (there is no compiled layer here)."""

from rlreplay.reverb.item_selectors import (
    Fifo as FifoSelector,
)
from rlreplay.reverb.item_selectors import (
    HeapSelector,
)
from rlreplay.reverb.item_selectors import (
    Lifo as LifoSelector,
)
from rlreplay.reverb.item_selectors import (
    Prioritized as PrioritizedSelector,
)
from rlreplay.reverb.item_selectors import (
    Uniform as UniformSelector,
)
from rlreplay.reverb.rate_limiters import RateLimiter
from rlreplay.reverb.replay_sample import SampleInfo
from rlreplay.reverb.trajectory_writer import CellRef as WeakCellRef


class Sampler:
    """What Reverb's compiled sampler tells of its output: each sampled item comes with
    ``NUM_INFO_TENSORS`` info fields (those of :class:`SampleInfo`)."""

    NUM_INFO_TENSORS = len(SampleInfo._fields)


__all__ = [
    "FifoSelector",
    "HeapSelector",
    "LifoSelector",
    "PrioritizedSelector",
    "RateLimiter",
    "Sampler",
    "UniformSelector",
    "WeakCellRef",
]
