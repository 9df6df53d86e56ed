"""Calls a sharded client splits by key or sums over shards: priority updates and
deletes sent to the shards owning their keys, and table statistics added up."""

from __future__ import annotations

from typing import Any

from rlreplay.core.table_info import TableInfo
from rlreplay.distributed.shard_health import ShardHealth
from rlreplay.errors import ServerUnavailableError

# TableInfo fields that add up over shards; the others are taken from the first shard.
SUMMED = (
    "size", "max_size", "store_capacity", "stored_steps", "inserts", "samples", "deletes",
    "evictions", "overwrite_evictions", "relocations", "stale_updates", "stale_deletes",
    "insert_blocked_s", "sample_blocked_s", "index_bytes",
)


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
