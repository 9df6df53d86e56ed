"""``reverb.timestep_dataset``: :class:`TimestepDataset` without TensorFlow."""

from rlreplay.reverb._datasets import TimestepDataset

__all__ = ["TimestepDataset"]
