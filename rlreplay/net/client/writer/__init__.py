"""A remote trajectory writer: steps buffered (:mod:`~rlreplay.net.client.writer.steps`),
items over them (:mod:`~rlreplay.net.client.writer.items`), sent as numbered chunks
(:mod:`~rlreplay.net.client.writer.chunks`) by a
:class:`~rlreplay.net.client.writer.remote_writer.RemoteTrajectoryWriter`."""

from rlreplay.net.client.writer.remote_writer import RemoteTrajectoryWriter

__all__ = ["RemoteTrajectoryWriter"]
