"""Writers and adders: turn environment steps into items."""

from rlreplay.writers.trajectory_writer import TrajectoryWriter

__all__ = ["TrajectoryWriter"]
