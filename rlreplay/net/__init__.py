"""Network layer: a replay server hosting tables and a client with the same calls.

Its packages: :mod:`rlreplay.net.wire` (what both sides share: the codec, framing, request
schemas, auth and the shared-memory segment format), :mod:`rlreplay.net.client` (the client,
its remote tables, writers and iterators) and :mod:`rlreplay.net.server` (the server, its
operations and what they serve).

Importing this package imports pyzmq and msgpack (the ``net`` extra); ``import rlreplay``
does not, and resolves ``rlreplay.Server`` / ``rlreplay.Client`` lazily.
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
