"""Scale-out: a sharded client over several replay servers, and Ray helpers (loaded lazily)."""

# Import the network package whole first: two threads importing it through different
# submodules could otherwise cross module locks and see a partly initialised module.
import rlreplay.net  # noqa: F401  (isort: skip)
from rlreplay.distributed.shard_keys import ShardKeys
from rlreplay.distributed.sharded_client import ShardedClient
from rlreplay.distributed.sharded_iterator import ShardedSampleIterator
from rlreplay.distributed.sharded_table import ShardedTable, ShardWriter

__all__ = ["ShardKeys", "ShardWriter", "ShardedClient", "ShardedSampleIterator", "ShardedTable"]
