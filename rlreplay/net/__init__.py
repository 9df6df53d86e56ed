"""Network layer: a replay server hosting tables and a client with the same calls.

Packages: :mod:`rlreplay.net.wire` (shared by both sides), :mod:`rlreplay.net.client` and
:mod:`rlreplay.net.server`. Importing it imports pyzmq and msgpack (the ``net`` extra);
``import rlreplay`` does not.
"""

from rlreplay.net.client.client import Client, RemoteTable
from rlreplay.net.client.iterator import SampleIterator
from rlreplay.net.client.writer import RemoteTrajectoryWriter
from rlreplay.net.server.config import tables_from_config
from rlreplay.net.server.server import Server

__all__ = [
    "Client",
    "RemoteTable",
    "RemoteTrajectoryWriter",
    "SampleIterator",
    "Server",
    "tables_from_config",
]
