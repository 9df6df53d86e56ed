"""``reverb.trajectory_dataset``: :class:`TrajectoryDataset` without TensorFlow."""

from rlreplay.reverb._datasets import TrajectoryDataset

__all__ = ["TrajectoryDataset"]
