"""Writers and adders: turn environment steps into items."""

from rlreplay.writers.nstep import NStepTransitionAdder
from rlreplay.writers.rollout import RolloutAdder
from rlreplay.writers.sequence import EpisodeAdder, SequenceAdder
from rlreplay.writers.sequence_items import SequenceItems
from rlreplay.writers.stream import StreamAdder
from rlreplay.writers.trajectory_writer import TrajectoryWriter

__all__ = [
    "EpisodeAdder",
    "NStepTransitionAdder",
    "RolloutAdder",
    "SequenceAdder",
    "SequenceItems",
    "StreamAdder",
    "TrajectoryWriter",
]
