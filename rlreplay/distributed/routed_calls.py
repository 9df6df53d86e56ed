"""Calls a sharded client sends to several shards: the same call on every reachable
shard (descriptions checked to agree), priority updates and deletes sent to the shards
owning their keys, and table statistics added up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlreplay.core.table_info import TableInfo
from rlreplay.distributed.shard_health import ShardHealth
from rlreplay.distributed.shard_keys import ShardKeys
from rlreplay.errors import InvalidArgumentError, ServerUnavailableError

# TableInfo fields that add up over shards; the others are taken from the first shard.
SUMMED = (
    "size", "max_size", "store_capacity", "stored_steps", "inserts", "samples", "deletes",
    "evictions", "overwrite_evictions", "relocations", "stale_updates", "stale_deletes",
    "insert_blocked_s", "sample_blocked_s", "index_bytes",
)


def each_shard(shards: list, health: ShardHealth, call: Callable[[Any], Any]) -> dict[int, Any]:
    """``call(client)`` on every reachable shard, in turn; the results by shard.

    Raises:
        ShardUnavailableError: for a shard down under ``"fail"``, or every shard down.
    """
    out = {}
    for shard in health.live():
        try:
            out[shard] = call(shards[shard])
        except ServerUnavailableError as error:
            health.failed(shard, error)
    if not out:
        health.live()  # raises: every shard is down
    return out


def same_table(
    table: str, descriptions: dict[int, dict], addresses: list[str], keys: ShardKeys
) -> dict[str, Any]:
    """The first of the shards' ``descriptions`` of ``table``, once every shard's is
    checked to describe the same table with a store the keys' shard bits can address.

    Raises:
        InvalidArgumentError: if shards describe ``table`` differently, or a shard's
            store is too large for the keys.
    """
    first_shard, first = next(iter(descriptions.items()))
    for shard, desc in descriptions.items():
        keys.check_capacity(desc["store_capacity"], table, addresses[shard])
        for key in ("signature", "layout"):
            if desc[key] != first[key]:
                raise InvalidArgumentError(
                    f"table {table!r} has another {key} at {addresses[shard]} than at "
                    f"{addresses[first_shard]}; every shard must serve the same table"
                )
    return first


def routed_call(
    shards: list, health: ShardHealth, op: str, table: str, groups: dict, wait: bool
) -> int | None:
    """Send ``op`` (``update_priorities`` or ``delete``) to each shard of ``groups``
    (``{shard: (local keys, priorities or None)}``), every request in flight before any
    reply is awaited.

    Returns:
        The items the shards changed, summed (None without ``wait``). Keys of a shard
        that is down are skipped under ``"skip"``.

    Raises:
        ShardUnavailableError: for a shard down, under ``"fail"``.
        InvalidArgumentError: from a shard that refused its keys (that shard changed
            nothing; the others may have applied theirs).
    """
    sent = {}
    for shard, (local, values) in groups.items():
        if health.is_down(shard):
            health.failed(shard, ServerUnavailableError("taken for down"))
            continue
        arrays = {"keys": local}
        if values is not None:
            arrays["priorities"] = values
        header: dict[str, Any] = {"op": op, "table": table}
        if not wait:
            header["noreply"] = True
        try:
            sent[shard] = shards[shard]._transport.send(header, arrays)
        except ServerUnavailableError as error:
            health.failed(shard, error)
    if not wait:
        return None
    count = 0
    for shard, rid in sent.items():
        client = shards[shard]
        try:
            count += int(client._transport.wait(rid, client.call_timeout)[0]["count"])
        except ServerUnavailableError as error:
            health.failed(shard, error)
    return count


def merged_info(infos: list[TableInfo]) -> TableInfo:
    """One :class:`TableInfo` of several shards' (counts and sizes summed)."""
    merged = infos[0].to_dict()
    for name in SUMMED:
        merged[name] = sum(getattr(i, name) for i in infos)
    return TableInfo(**merged)
