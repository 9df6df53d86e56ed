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
from rlreplay.layout import ItemLayout, Window
from rlreplay.rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack
from rlreplay.sample import Sample, SampleInfo
from rlreplay.selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform
from rlreplay.specs import FieldSpec, Signature
from rlreplay.storage import StepStore
from rlreplay.table import Table, TableInfo
from rlreplay.writers import TrajectoryWriter

__version__ = "0.1.0"

__all__ = [
    "ClosedError",
    "DeadlockError",
    "EmptyTableError",
    "FieldSpec",
    "Fifo",
    "InvalidArgumentError",
    "ItemLayout",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "MinSize",
    "Prioritized",
    "Queue",
    "RateLimiter",
    "RateLimiterTimeoutError",
    "ReplayError",
    "ReplayTimeoutError",
    "Sample",
    "SampleInfo",
    "SampleToInsertRatio",
    "Selector",
    "Signature",
    "SignatureError",
    "Stack",
    "StepStore",
    "Table",
    "TableInfo",
    "TrajectoryWriter",
    "Uniform",
    "Window",
    "__version__",
]
