"""A remote trajectory writer: buffered steps and items, sent as numbered chunks by a
:class:`~rlreplay.net.client.writer.remote_writer.RemoteTrajectoryWriter`."""

from rlreplay.net.client.writer.remote_writer import RemoteTrajectoryWriter

__all__ = ["RemoteTrajectoryWriter"]
