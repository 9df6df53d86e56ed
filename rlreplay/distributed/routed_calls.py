"""Calls sent to several shards: the same call on each, routed updates and deletes, stats."""

from __future__ import annotations

from typing import Any

from rlreplay.core.table_info import TableInfo
from rlreplay.distributed.shard_deadline import Deadline, greet
from rlreplay.distributed.shard_health import ShardHealth
from rlreplay.distributed.shard_keys import ShardKeys
from rlreplay.errors import InvalidArgumentError, ReplayError, ServerUnavailableError

# TableInfo fields that add up over shards; the others are taken from the first shard.
SUMMED = (
    "size", "max_size", "store_capacity", "stored_steps", "inserts", "samples", "deletes",
    "evictions", "overwrite_evictions", "relocations", "stale_updates", "stale_deletes",
    "sampled_items",
    "insert_blocked_s", "sample_blocked_s", "index_bytes",
)


def each_shard(
    shards: list, health: ShardHealth, deadline: Deadline, header: dict
) -> dict[int, dict]:
    """Send ``header`` to every reachable shard at once, within ``deadline``; replies by shard.

    Raises:
        ShardUnavailableError: for a shard down under ``"fail"``, or every shard down.
    """
    until = deadline.bound

    def reply(shard: int, rid: int) -> dict:
        header = shards[shard].transport.wait_until(rid, until)[0]
        health.answered(shard)
        return header

    sent = per_shard(
        health, reachable(shards, health, deadline),
        lambda shard: shards[shard].transport.send(header, until=until, expires=until),
    )
    try:
        return per_shard(
            health, list(sent), lambda shard: reply(shard, sent.pop(shard)), at_least_one=True
        )
    finally:
        for shard, rid in sent.items():  # an error left these unread
            shards[shard].transport.forget([rid])


def described(
    shards: list, health: ShardHealth, deadline: Deadline, table: str
) -> dict[int, dict]:
    """Every reachable shard's description of ``table`` (cached per client), within ``deadline``.

    Raises:
        InvalidArgumentError: if a shard does not serve ``table``.
        ShardUnavailableError: for a shard down under ``"fail"``, or every shard down.
    """
    return per_shard(
        health, reachable(shards, health, deadline),
        lambda shard: shards[shard].describe(table, until=deadline.bound),
        at_least_one=True,
    )


def reachable(shards: list, health: ShardHealth, deadline: Deadline) -> list[int]:
    """The shards not taken for down, greeted (those that did not answer left out)."""
    silent = greet(shards, health.live(), deadline, health.failed)
    return [shard for shard in health.live() if shard not in silent]


def per_shard(
    health: ShardHealth, indices: Any, call: Any, at_least_one: bool = False
) -> dict[int, Any]:
    """``call(shard)`` for each of ``indices``, by shard; silent shards handled by the policy.

    Raises:
        ShardUnavailableError: as ``health.failed``; with ``at_least_one``, if none answered.
    """
    out = {}
    for shard in indices:
        try:
            out[shard] = call(shard)
        except ServerUnavailableError as error:
            health.failed(shard, error)
    if at_least_one and not out:
        health.live()  # raises: every shard is down
    return out


def same_table(
    table: str, descriptions: dict[int, dict], addresses: list[str], keys: ShardKeys
) -> dict[str, Any]:
    """The shards' common description of ``table``, checked to agree and fit the key bits.

    Raises:
        InvalidArgumentError: if shards differ, or a shard's store is too large for the keys.
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
    shards: list, health: ShardHealth, op: str, table: str, groups: dict, wait: bool,
    deadline: Deadline,
) -> int | None:
    """Send ``op`` (``update_priorities`` or ``delete``) to each shard of ``groups`` at once.

    Returns:
        The items changed, summed (None without ``wait``); down shards skipped under ``"skip"``.

    Raises:
        ShardUnavailableError: for a shard down, under ``"fail"``.
        InvalidArgumentError: from a shard that refused its keys (names those that applied).
    """
    sent = {}
    silent = greet(shards, [s for s in groups if not health.is_down(s)], deadline, health.failed)
    until = deadline.bound
    for shard, (local, values) in groups.items():
        if shard in silent or health.is_down(shard):
            health.failed(shard, ServerUnavailableError("taken for down"))
            continue
        arrays = {"keys": local}
        if values is not None:
            arrays["priorities"] = values
        header: dict[str, Any] = {"op": op, "table": table}
        if not wait:
            header["noreply"] = True
        try:
            sent[shard] = shards[shard].transport.send(
                header, arrays, until=until, expires=until if wait else None
            )
        except ServerUnavailableError as error:
            health.failed(shard, error)
    if not wait:
        return None
    count = 0
    refused: dict[int, ReplayError] = {}
    applied = []
    for shard, rid in sent.items():
        client = shards[shard]
        try:
            count += int(client.transport.wait_until(rid, until)[0]["count"])
            applied.append(shard)
        except ServerUnavailableError as error:
            health.failed(shard, error)
        except ReplayError as error:  # the others are still awaited: they may apply theirs
            refused[shard] = error
    if refused:
        shard, error = next(iter(refused.items()))
        done = f"shards {applied} applied theirs" if applied else "no shard applied its keys"
        if isinstance(error, InvalidArgumentError):
            what = (
                f"refused its part of the {op} (its keys in the shard's own numbering, "
                f"without the shard bits): {error}; it changed nothing"
            )
        else:
            what = f"did not complete its part of the {op}: {error}"
        message = f"replay shard {shard} at {health.addresses[shard]} {what}, {done}"
        try:
            named = type(error)(message)
        except TypeError:  # an error class with another constructor: raised as it is
            raise error from None
        raise named from error
    return count


def merged_info(infos: list[TableInfo]) -> TableInfo:
    """One :class:`TableInfo` of several shards' (counts and sizes summed)."""
    merged = infos[0].to_dict()
    for name in SUMMED:
        merged[name] = sum(getattr(i, name) for i in infos)
    return TableInfo(**merged)
