"""Scale-out: a sharded client over several replay servers, and Ray helpers.

Importing this package imports the network layer (pyzmq, msgpack); ``import rlreplay``
does not, and resolves ``rlreplay.ShardedClient`` lazily. The Ray helpers are in
:mod:`rlreplay.distributed.ray`, imported only when used (the ``ray`` extra).
"""

# The network package first, whole: a thread importing this package while another
# imports ``rlreplay.net`` then waits for that package instead of entering its submodules
# half-way (Python imports a submodule without waiting for a parent package that another
# thread is still running; the two threads' module locks then cross and one of them gets
# a partly initialised module).
import rlreplay.net  # noqa: F401  (isort: skip)
from rlreplay.distributed.shard_keys import ShardKeys
from rlreplay.distributed.sharded_client import ShardedClient
from rlreplay.distributed.sharded_iterator import ShardedSampleIterator
from rlreplay.distributed.sharded_table import ShardedTable, ShardWriter

__all__ = ["ShardKeys", "ShardWriter", "ShardedClient", "ShardedSampleIterator", "ShardedTable"]
