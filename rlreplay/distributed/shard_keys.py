"""Keys of a sharded table: a shard's own item key with the shard's index in its top bits."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlreplay.core.keys import SLOT_BITS, check_priorities, key_array
from rlreplay.errors import InvalidArgumentError, describe


class ShardKeys:
    """Translation between a shard's keys and the sharded client's keys.

    Args:
        num_shards: shards of the client (>= 1).

    Example:
        >>> keys = ShardKeys(4)
        >>> g = keys.to_global(np.array([7], np.int64), 2)
        >>> int(keys.split(g)[1][0]), int(keys.shard_of(g)[0])
        (7, 2)
    """

    def __init__(self, num_shards: int):
        self.num_shards = num_shards
        self.bits = (num_shards - 1).bit_length()
        self.shift = SLOT_BITS - self.bits
        self.max_capacity = 1 << self.shift
        self._mask = np.int64(((1 << self.bits) - 1) << self.shift)

    def check_capacity(self, capacity: int, table: str, address: str) -> None:
        """Refuse a shard whose slots would reach into the shard bits.

        Raises:
            InvalidArgumentError: if ``capacity`` is above ``2 ** (32 - bits)``.
        """
        if capacity > self.max_capacity:
            raise InvalidArgumentError(
                f"table {table!r} at {address} has store_capacity={capacity}; with "
                f"{self.num_shards} shards a shard's keys leave {self.shift} bits for the slot, "
                f"so a shard's store holds at most {self.max_capacity} rows: use smaller "
                "stores (and more shards), or fewer shards"
            )

    def check_shard_tables(self, client: Any, tables: Any, until: float) -> None:
        """:meth:`check_capacity` for ``tables`` of ``client``'s shard, fetched by ``until``.

        Raises:
            InvalidArgumentError: as :meth:`check_capacity`, or for an unknown table.
            ServerUnavailableError: if the shard did not answer by ``until``.
        """
        for table in tables:
            if isinstance(table, str):  # (other values: the shard's client says why)
                capacity = client.describe(table, until=until)["store_capacity"]
                self.check_capacity(capacity, table, client.address)

    def to_global(self, keys: np.ndarray, shard: int) -> np.ndarray:
        """``keys`` of ``shard`` as the client's keys (a new int64 array)."""
        return np.asarray(keys, dtype=np.int64) | np.int64(shard << self.shift)

    def shard_of(self, keys: np.ndarray) -> np.ndarray:
        """The shard index of each of the client's ``keys``."""
        return (keys & self._mask) >> self.shift

    def split(self, keys: Any, argument: str = "keys") -> tuple[np.ndarray, np.ndarray]:
        """Validate the client's ``keys``; returns ``(shards, local keys)`` as int64.

        Raises:
            InvalidArgumentError: for keys not a 1-d non-negative int array of this client's shards.
        """
        arr = key_array(keys, argument)
        shards = self.shard_of(arr)
        bad = (arr < 0) | (shards >= self.num_shards)
        if bad.any():
            raise InvalidArgumentError(
                f"{argument} contains {describe(arr[bad][:4].tolist())}, which are not keys of "
                f"this sharded table ({self.num_shards} shards); pass keys taken from its "
                "samples or inserts"
            )
        return shards, arr & ~self._mask

    def group(self, keys: Any, values: Any | None = None, argument: str = "keys"):
        """The client's ``keys`` (and ``values``, per key or one for all) grouped by shard.

        Raises:
            InvalidArgumentError: as :meth:`split`, or for values that are not priorities >= 0.
        """
        shards, local = self.split(keys, argument)
        vals = None if values is None else check_priorities(values, len(local))
        groups = {}
        for shard in np.unique(shards).tolist():
            mask = shards == shard
            groups[int(shard)] = (local[mask], None if vals is None else vals[mask])
        return groups
