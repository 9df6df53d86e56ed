"""rlreplay: experience replay for reinforcement learning.

The embedded default is an in-process :class:`Table`; see the README for the tour.
"""

from rlreplay import checkpoint, datasets
from rlreplay.core.layout import ItemLayout, Window
from rlreplay.core.rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack
from rlreplay.core.sample import Sample, SampleInfo
from rlreplay.core.selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform
from rlreplay.core.specs import FieldSpec, Signature
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table, TableInfo
from rlreplay.errors import (
    AddressInUseError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    ClosedError,
    ComponentFailedError,
    DatasetError,
    DeadlockError,
    EmptyTableError,
    InsufficientMemoryError,
    InvalidArgumentError,
    ProtocolError,
    RateLimiterTimeoutError,
    ReplayError,
    ReplayTimeoutError,
    ResourceLimitError,
    ServerRestartedError,
    ServerUnavailableError,
    ShardUnavailableError,
    SignatureError,
)
from rlreplay.iterators import ReplayIterator, learn_while_can_sample
from rlreplay.version import __version__
from rlreplay.writers import (
    EpisodeAdder,
    NStepTransitionAdder,
    RolloutAdder,
    SequenceAdder,
    SequenceItems,
    StreamAdder,
    TrajectoryWriter,
)

# The network layer needs pyzmq and msgpack; it is imported on first use of these names.
_NET_NAMES = ("Client", "RemoteTrajectoryWriter", "SampleIterator", "Server")


def __getattr__(name: str):
    if name in _NET_NAMES or name == "ShardedClient":  # the network layer's extra
        try:
            import rlreplay.distributed
            import rlreplay.net
        except ModuleNotFoundError as error:
            if error.name not in ("zmq", "msgpack"):
                raise
            raise ImportError(
                f"rlreplay.{name} needs the network layer's packages ({error.name} is not "
                "installed); install them with python -m pip install 'rlreplay[net]'"
            ) from error
        if name == "ShardedClient":
            return rlreplay.distributed.ShardedClient
        return getattr(rlreplay.net, name)
    raise AttributeError(f"module 'rlreplay' has no attribute {name!r}")


__all__ = [
    "AddressInUseError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointVersionError",
    "Client",
    "ClosedError",
    "ComponentFailedError",
    "DatasetError",
    "DeadlockError",
    "EmptyTableError",
    "EpisodeAdder",
    "FieldSpec",
    "Fifo",
    "InsufficientMemoryError",
    "InvalidArgumentError",
    "ItemLayout",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "MinSize",
    "NStepTransitionAdder",
    "Prioritized",
    "ProtocolError",
    "Queue",
    "RateLimiter",
    "RateLimiterTimeoutError",
    "ReplayError",
    "ReplayIterator",
    "ReplayTimeoutError",
    "ResourceLimitError",
    "Sample",
    "SampleInfo",
    "SampleToInsertRatio",
    "RemoteTrajectoryWriter",
    "RolloutAdder",
    "SampleIterator",
    "SequenceAdder",
    "SequenceItems",
    "Selector",
    "Server",
    "ServerRestartedError",
    "ServerUnavailableError",
    "ShardUnavailableError",
    "ShardedClient",
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
    "checkpoint",
    "datasets",
    "learn_while_can_sample",
]
