"""Checkpoints of every shard of a sharded client, asked for at once (no common moment)."""

from __future__ import annotations

from typing import Any

from rlreplay.distributed.shard_deadline import Deadline, greet
from rlreplay.distributed.shard_health import ShardHealth
from rlreplay.errors import ReplayError, ServerUnavailableError, ShardUnavailableError


def checkpoint_shards(shards: list, health: ShardHealth, deadline: Deadline) -> dict[int, str]:
    """Ask every reachable shard for a checkpoint at once and wait; directories by shard index.

    Failures are raised once every request is answered, naming the shard and what the others
    published.

    Raises:
        ShardUnavailableError: for a shard down under ``"fail"`` (or every shard down).
        InvalidArgumentError: for a shard started without a checkpoint directory.
        CheckpointError: for a shard whose checkpoint could not be written.
        ReplayTimeoutError: for a shard that did not publish within ``timeout``.
    """
    errors: dict[int, BaseException] = {}
    sent: dict[int, tuple[int, Any]] = {}
    greet(shards, health.live(), deadline, lambda s, e: note_down(health, s, e, errors))
    until = deadline.until  # when waiting for the shards' replies ends
    for shard in health.live():
        if shard in errors:
            continue
        transport = shards[shard].transport
        try:
            rid = transport.send(
                {"op": "checkpoint"}, until=deadline.bound, expires=until,
                timeout=deadline.timeout,
            )
            sent[shard] = (rid, until)
        except ServerUnavailableError as error:
            note_down(health, shard, error, errors)
    paths: dict[int, str] = {}
    for shard, (rid, until) in sent.items():
        try:
            paths[shard] = str(shards[shard].transport.wait_until(rid, until)[0]["path"])
            health.answered(shard)
        except ServerUnavailableError as error:
            note_down(health, shard, error, errors)
        except ReplayError as error:
            errors[shard] = error
    if errors:
        shard = min(errors)
        raise shard_error(errors[shard], shard, health.addresses[shard], paths)
    if not paths:
        health.live()  # raises: every shard is down
    return paths


def note_down(
    health: ShardHealth, shard: int, error: ServerUnavailableError, errors: dict
) -> None:
    """Note that ``shard`` did not answer; under ``"fail"`` keep the error for later."""
    try:
        health.failed(shard, error)
    except ShardUnavailableError as failure:
        errors[shard] = failure


def shard_error(
    error: BaseException, shard: int, address: str, paths: dict[int, str]
) -> BaseException:
    """``error`` of ``shard``, same class, naming the shard and what the others published."""
    if isinstance(error, ShardUnavailableError):
        prefix = ""
    else:
        prefix = f"replay shard {shard} at {address}: "
    others = (
        f"; the other shards published {paths}" if paths else "; no shard published a checkpoint"
    )
    message = f"{prefix}{error}{others}"
    try:
        if isinstance(error, ShardUnavailableError):
            new = ShardUnavailableError(message, error.reason, error.shard, error.address)
        else:
            new = type(error)(message)
    except TypeError:  # an error class with another constructor: raise it as it is
        return error
    new.__cause__ = error
    return new
