"""Network layer: a replay server hosting tables and a client with the same calls.

Importing this package imports pyzmq and msgpack (the ``net`` extra); ``import rlreplay``
does not, and resolves ``rlreplay.Server`` / ``rlreplay.Client`` lazily.
"""

from rlreplay.net.client import Client
from rlreplay.net.config import tables_from_config
from rlreplay.net.iterator import SampleIterator
from rlreplay.net.remote_table import RemoteTable
from rlreplay.net.server import Server
from rlreplay.net.writer import RemoteTrajectoryWriter

__all__ = [
    "Client",
    "RemoteTable",
    "RemoteTrajectoryWriter",
    "SampleIterator",
    "Server",
    "tables_from_config",
]
