"""rlreplay: experience replay for reinforcement learning.

The embedded default is an in-process :class:`Table`; see the README for the tour.
"""

from rlreplay.errors import (
    ClosedError,
    DeadlockError,
    EmptyTableError,
    InvalidArgumentError,
    RateLimiterTimeoutError,
    ReplayError,
    ReplayTimeoutError,
    SignatureError,
)
from rlreplay.iterators import ReplayIterator, learn_while_can_sample
from rlreplay.layout import ItemLayout, Window
from rlreplay.rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack
from rlreplay.sample import Sample, SampleInfo
from rlreplay.selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform
from rlreplay.specs import FieldSpec, Signature
from rlreplay.storage import StepStore
from rlreplay.table import Table, TableInfo
from rlreplay.writers import (
    EpisodeAdder,
    NStepTransitionAdder,
    SequenceAdder,
    SequenceItems,
    StreamAdder,
    TrajectoryWriter,
)

__version__ = "0.1.0"

__all__ = [
    "ClosedError",
    "DeadlockError",
    "EmptyTableError",
    "EpisodeAdder",
    "FieldSpec",
    "Fifo",
    "InvalidArgumentError",
    "ItemLayout",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "MinSize",
    "NStepTransitionAdder",
    "Prioritized",
    "Queue",
    "RateLimiter",
    "RateLimiterTimeoutError",
    "ReplayError",
    "ReplayIterator",
    "ReplayTimeoutError",
    "Sample",
    "SampleInfo",
    "SampleToInsertRatio",
    "SequenceAdder",
    "SequenceItems",
    "Selector",
    "Signature",
    "SignatureError",
    "Stack",
    "StepStore",
    "StreamAdder",
    "Table",
    "TableInfo",
    "TrajectoryWriter",
    "Uniform",
    "Window",
    "__version__",
    "learn_while_can_sample",
]
