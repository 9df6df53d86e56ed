"""A learner's calls on a served table: sample requests, awaited or kept in flight, that may
carry the previous batch's new priorities, and priority updates sent on their own.

A learner's cycle (sample, learn, send new priorities) is one round trip when each sample
request carries the last batch's priorities; the server applies such an update before it
samples. Sampled batches come back through shared memory where the client's
:class:`~rlreplay.net.client.shm.SharedMemoryPath` can use it, else through the socket.

These are methods of :class:`~rlreplay.net.client.client.Client` (bound there by name), kept here
with the requests they build and the replies they read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlreplay.core.sample import Sample
from rlreplay.core.table_checks import check_timeout
from rlreplay.net.client.table_requests import sample_request
from rlreplay.net.wire.payloads import update_arrays

if TYPE_CHECKING:
    from rlreplay.net.client.client import Client


def sample(
    client: Client,
    table: str,
    batch_size: int,
    *,
    timeout: float | None = None,
    update: tuple[Any, Any] | None = None,
) -> Sample:
    """:meth:`Table.sample` on the server's ``table``, optionally after a priority update.

    A learner's cycle (sample, learn, send new priorities) is one round trip when each
    sample request carries the previous batch's priorities::

        update = None
        while training:
            batch = client.sample("replay", 256, timeout=5.0, update=update)
            update = (batch.info.keys, learn(batch))

    Args:
        table: the table's name.
        batch_size: items to sample.
        timeout: seconds the rate limiter may block the sample (``None``: no limit).
            It bounds the whole call, plus ``REPLY_GRACE_S`` for the server's answer.
        update: ``(keys, priorities)`` for :meth:`Table.update_priorities` on the same
            table. The server checks and applies it when the request arrives, before
            sampling (so the sample already sees the new priorities); keys of items no
            longer held are skipped and counted in ``stale_updates``. It stays applied
            if the sample then waits and times out. If the update is invalid, nothing
            is updated and nothing is sampled.

    Returns:
        The :class:`~rlreplay.Sample`.

    Raises:
        InvalidArgumentError: for an invalid batch size, timeout or update (the same
            error :meth:`update_priorities` raises for that update).
        RateLimiterTimeoutError: if the sample waited ``timeout`` seconds.
        ServerUnavailableError: if the server does not answer; neither the sample nor
            the update was applied, nor will be (ServerRestartedError if the server
            restarted meanwhile).
    """
    timeout = check_timeout(timeout)
    until = client._transport.until(timeout)
    header, arrays = sample_request(table, batch_size, update)
    shm = client._shm
    rid = shm.send_sample(header, arrays, until=until, expires=until, timeout=timeout)
    return shm.sample(client._transport.wait_until(rid, until))


def sample_async(
    client: Client,
    table: str,
    batch_size: int,
    *,
    timeout: float | None = None,
    update: tuple[Any, Any] | None = None,
) -> int:
    """Send a sample request (and ``update``, see :meth:`sample`) without waiting.

    With a ``timeout``, no server starts the request later than ``timeout`` (plus
    ``REPLY_GRACE_S``) from now, as for :meth:`sample`: a :meth:`sample_result` that
    hears nothing by then raises ServerUnavailableError, and neither the sample nor
    the update is applied afterwards.

    Returns:
        The request's id, for :meth:`sample_result`.

    Raises:
        InvalidArgumentError: for an invalid timeout, or an update whose keys are not
            integers or whose priorities are not numbers.
        ServerUnavailableError: if the request could not be sent within ``timeout``.
    """
    timeout = check_timeout(timeout)
    header, arrays = sample_request(table, batch_size, update)
    until = client._transport.until(timeout)
    return client._shm.send_sample(header, arrays, until=until, expires=until, timeout=timeout)


def sample_result(client: Client, rid: int, timeout: float | None = None) -> Sample:
    """The sample requested as ``rid`` (waits up to ``timeout`` + a short grace)."""
    tr = client._transport
    return client._shm.sample(tr.wait_until(rid, tr.until(check_timeout(timeout))))


def update_priorities(
    client: Client, table: str, keys: Any, priorities: Any, *, wait: bool = True
) -> int | None:
    """:meth:`Table.update_priorities`: one priority per key, or one for all keys.

    With ``wait=False`` returns at once (None) and the server only logs errors. A
    learner can instead send the update with its next sample request
    (``sample(..., update=(keys, priorities))``) and save a round trip.

    Returns:
        How many items were updated (keys of items no longer held are skipped).

    Raises:
        InvalidArgumentError: for keys or priorities the table refuses.
    """
    arrays = update_arrays(keys, priorities)
    header: dict[str, Any] = {"op": "update_priorities", "table": table}
    if not wait:
        header["noreply"] = True
        client._send(header, arrays)
        return None
    return int(client._transport.call(header, arrays)[0]["count"])
