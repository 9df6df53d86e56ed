"""Scale-out: a sharded client over several replay servers, and Ray helpers.

Importing this package imports the network layer (pyzmq, msgpack); ``import rlreplay``
does not, and resolves ``rlreplay.ShardedClient`` lazily. The Ray helpers are in
:mod:`rlreplay.distributed.ray`, imported only when used (the ``ray`` extra).
"""

from rlreplay.distributed.shard_keys import ShardKeys
from rlreplay.distributed.sharded_client import ShardedClient
from rlreplay.distributed.sharded_iterator import ShardedSampleIterator
from rlreplay.distributed.sharded_table import ShardedTable, ShardWriter

__all__ = ["ShardKeys", "ShardWriter", "ShardedClient", "ShardedSampleIterator", "ShardedTable"]
