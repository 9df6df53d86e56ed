"""The replay client: the calls of a local :class:`rlreplay.Table`, served by a Server.

A client opens its socket lazily in the process that uses it and pickles as its address
and keys. Requests are checked (:func:`insert_request`, :func:`sample_request`) before sending.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.sample import Sample
from rlreplay.core.specs import Signature
from rlreplay.core.table_info import TableInfo
from rlreplay.errors import InvalidArgumentError, check_timeout, describe
from rlreplay.net.client.iterator import SampleIterator
from rlreplay.net.client.served_tables import ServedTables
from rlreplay.net.client.settings import ClientSettings, check_call_timeout
from rlreplay.net.client.shm import SharedMemoryPath
from rlreplay.net.client.transport import CALL, DIAGNOSE_S, REPLY_GRACE_S, Transport
from rlreplay.net.client.writer import RemoteTrajectoryWriter
from rlreplay.net.wire.payloads import rows_arrays, update_arrays

__all__ = ["REPLY_GRACE_S", "Client"]


class Client:
    """Connection to a replay :class:`~rlreplay.Server`.

    Thread-safe: each thread (and process) gets its own socket, so a blocked call never holds
    up another. :meth:`table` returns a handle with the exact calls of a local
    :class:`~rlreplay.Table`.

    Args:
        address: ``tcp://host:port``, ``host:port`` or ``ipc:///path``.
        server_public_key: the server's public key (``.key`` path or z85 bytes), for CURVE.
        client_secret_key: this client's ``.key_secret`` file (default: ephemeral keys).
        call_timeout: seconds calls that never block wait before ServerUnavailableError.
        liveness_s: a call waiting without timeout pings after half this many silent
            seconds and gives up after twice as many.
        diagnose_timeout: seconds spent, after a call got no answer, finding out why (0: skip).
        shared_memory: use same-host shared memory: ``None`` (default) where usable,
            ``False`` never, ``True`` always.

    Raises:
        InvalidArgumentError: for a malformed address, unreadable key files, out-of-range
            seconds, or ``shared_memory=True`` without ``/dev/shm``.

    A call that gets no answer raises :class:`~rlreplay.errors.ServerUnavailableError`
    within its timeout plus ``REPLY_GRACE_S`` (0.5 s), or ``call_timeout`` for calls that
    never block, saying why where known.

    Attributes:
        address: the server's address, as given.
        transport: the :class:`~rlreplay.net.client.transport.Transport` all requests use.

    Example:
        >>> client = Client(server.address)                       # doctest: +SKIP
        >>> keys = client.insert("replay", {"obs": obs, "reward": 1.0})  # doctest: +SKIP
        >>> batch = client.sample("replay", 256, timeout=5.0)     # doctest: +SKIP
    """

    def __init__(
        self,
        address: str,
        *,
        server_public_key: str | bytes | None = None,
        client_secret_key: str | bytes | tuple[bytes, bytes] | None = None,
        call_timeout: float = 30.0,
        liveness_s: float = 5.0,
        diagnose_timeout: float = DIAGNOSE_S,
        shared_memory: bool | None = None,
    ):
        settings = ClientSettings.check(
            address,
            server_public_key,
            client_secret_key,
            call_timeout,
            liveness_s,
            diagnose_timeout,
            shared_memory,
        )
        self._settings = settings
        self.address = settings.address
        self.transport = Transport(
            settings.address,
            settings.server_public_key,
            settings.client_secret_key,
            settings.call_timeout,
            settings.liveness_s,
            settings.diagnose_timeout,
        )
        self._shm = SharedMemoryPath(self.address, shared_memory, self.transport)
        if self._shm.enabled:
            self.transport.shm = self._shm
        self._tables = ServedTables(self.address, self.transport)

    def __getstate__(self) -> dict:
        return self._settings.arguments(self.call_timeout)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @property
    def call_timeout(self) -> float:
        """Seconds calls that never block on a rate limiter wait for their reply."""
        return self.transport.call_timeout

    @call_timeout.setter
    def call_timeout(self, value: float) -> None:
        self.transport.call_timeout = check_call_timeout(value)

    @property
    def liveness_s(self) -> float:
        """A waiting call pings after this many silent seconds (see the class)."""
        return self.transport.liveness_s

    def close(self) -> None:
        """Close this process's sockets for good: later calls (also of its writers and
        iterators) raise :class:`~rlreplay.errors.ClosedError`. A pickled copy is open."""
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ping(self, timeout: float | None = None) -> list[str]:
        """Names of the served tables within ``timeout`` (default ``call_timeout``) seconds."""
        timeout = self.transport.call_timeout if timeout is None else check_timeout(timeout)
        until = time.monotonic() + timeout
        tr = self.transport
        return list(tr.wait_until(tr.send({"op": "ping"}, until=until), until)[0]["tables"])

    def describe(self, table: str, *, until: Any = CALL) -> dict[str, Any]:
        """Signature, layout and sizes of ``table`` (fetched once, then cached).

        ``until``: ``time.monotonic()`` deadline for the reply; default ``call_timeout``.
        """
        return self._tables.describe(table, until)

    def signature(self, table: str) -> Signature:
        return self._tables.signature(table, CALL)

    def insert(
        self,
        table: str,
        rows: Mapping[str, Any],
        priorities: Any = None,
        *,
        timeout: float | None = None,
        until: Any = CALL,
    ) -> np.ndarray:
        """:meth:`Table.insert` on the server's ``table`` (rows checked locally first); one
        round trip. To stream steps, use :meth:`trajectory_writer`.

        Args:
            table: the table's name.
            rows: one row, or rows with a leading batch axis.
            priorities: one per row, one for all, or ``None`` (the table's default).
            timeout: seconds the rate limiter may block (``None``: no limit).
            until: shared ``time.monotonic()`` deadline for the reply (``None``: none);
                default: from ``timeout``.

        Returns:
            int64 keys of the new items.

        Raises:
            SignatureError, InvalidArgumentError: for refused rows, priorities or timeout.
            RateLimiterTimeoutError: if blocked for ``timeout`` (nothing stored, ever).
            ServerUnavailableError: if the server did not answer (rows never applied later).
            ServerRestartedError: if the server restarted meanwhile (nothing applied).
        """
        timeout = check_timeout(timeout)
        if until is CALL:
            until = self.transport.until(timeout)
        header, arrays = insert_request(self._tables, table, rows, priorities, until)
        return self.transport.call(header, arrays, timeout, until)[1]["keys"]

    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout: float | None = None,
        update: tuple[Any, Any] | None = None,
    ) -> Sample:
        """:meth:`Table.sample` on the server's ``table``, optionally after a priority update.

        Passing ``(batch.info.keys, new_priorities)`` of the previous batch as ``update``
        makes a learner's cycle one round trip.

        Args:
            table: the table's name.
            batch_size: items to sample.
            timeout: seconds the rate limiter may block (``None``: no limit).
            update: ``(keys, priorities)`` applied before sampling, even if it then times
                out (stale keys skipped); if invalid, nothing is updated or sampled.

        Returns:
            The :class:`~rlreplay.Sample`.

        Raises:
            InvalidArgumentError: for an invalid batch size, timeout or update.
            RateLimiterTimeoutError: if the sample waited ``timeout`` seconds.
            ServerUnavailableError: if the server does not answer (nothing applied, ever).
            ServerRestartedError: if the server restarted meanwhile (nothing applied).
        """
        timeout = check_timeout(timeout)
        until = self.transport.until(timeout)
        header, arrays = sample_request(table, batch_size, update)
        shm = self._shm
        rid = shm.send_sample(header, arrays, until=until, expires=until, timeout=timeout)
        return shm.sample(self.transport.wait_until(rid, until))


    def sample_async(
        self,
        table: str,
        batch_size: int,
        *,
        timeout: float | None = None,
        update: tuple[Any, Any] | None = None,
    ) -> int:
        """Send a sample request (and ``update``, see :meth:`sample`) without waiting; no
        server starts it later than ``timeout`` plus ``REPLY_GRACE_S`` from now.

        Returns:
            The request's id, for :meth:`sample_result`.

        Raises:
            InvalidArgumentError: for an invalid timeout or update.
            ServerUnavailableError: if the request could not be sent within ``timeout``.
        """
        timeout = check_timeout(timeout)
        header, arrays = sample_request(table, batch_size, update)
        until = self.transport.until(timeout)
        return self._shm.send_sample(header, arrays, until=until, expires=until, timeout=timeout)


    def sample_result(self, rid: int, timeout: float | None = None) -> Sample:
        """The sample requested as ``rid`` (waits up to ``timeout`` + a short grace)."""
        tr = self.transport
        return self._shm.sample(tr.wait_until(rid, tr.until(check_timeout(timeout))))


    def update_priorities(
        self, table: str, keys: Any, priorities: Any, *, wait: bool = True
    ) -> int | None:
        """:meth:`Table.update_priorities`: one priority per key, or one for all keys. With
        ``wait=False`` returns None at once (waiting at most ``REPLY_GRACE_S`` for a first
        handshake) and the server only logs errors.

        Returns:
            How many items were updated (keys of items no longer held are skipped).

        Raises:
            InvalidArgumentError: for keys or priorities the table refuses.
            ServerUnavailableError: if the server did not answer.
        """
        arrays = update_arrays(keys, priorities)
        header: dict[str, Any] = {"op": "update_priorities", "table": table}
        if not wait:
            header["noreply"] = True
            self.transport.send(header, arrays, until=time.monotonic() + REPLY_GRACE_S)
            return None
        return int(self.transport.call(header, arrays)[0]["count"])

    def delete(self, table: str, keys: Any) -> int:
        """:meth:`Table.delete`; returns how many items were removed."""
        keys = update_arrays(keys, 0.0)["keys"]
        reply = self.transport.call({"op": "delete", "table": table}, {"keys": keys})
        return int(reply[0]["count"])

    def reset(self, table: str) -> None:
        """:meth:`Table.reset` on the server's ``table``."""
        self.transport.call({"op": "reset", "table": table})

    def can_insert(self, table: str, num_inserts: int = 1) -> bool:
        """:meth:`Table.can_insert` on the server's ``table``."""
        header = {"op": "can_insert", "table": table, "n": plain_int(num_inserts)}
        return bool(self.transport.call(header)[0]["result"])

    def can_sample(self, table: str, num_samples: int = 1) -> bool:
        """:meth:`Table.can_sample` on the server's ``table``."""
        header = {"op": "can_sample", "table": table, "n": plain_int(num_samples)}
        return bool(self.transport.call(header)[0]["result"])

    def info(self, table: str, *, until: Any = CALL) -> TableInfo:
        """:meth:`Table.info` of the server's ``table`` (``until`` as in :meth:`describe`)."""
        return TableInfo.from_stats(self.server_info(table, until=until)[table])

    def server_info(
        self, table: str | None = None, *, until: Any = CALL
    ) -> dict[str, dict[str, Any]]:
        """Per table: TableInfo fields plus insert and sample rates (``until`` as in describe)."""
        header = {"op": "info"} if table is None else {"op": "info", "table": table}
        return self.transport.call(header, until=until)[0]["tables"]

    def checkpoint(self, timeout: float | None = None) -> str:
        """Have the server checkpoint all tables and writer streams; blocks until published.
        It holds everything acknowledged before the call; the server keeps serving.

        Args:
            timeout: seconds to wait (``None``: as long as the server answers pings).

        Returns:
            The checkpoint's directory on the server's machine.

        Raises:
            InvalidArgumentError: if the server has no checkpoint directory.
            CheckpointError: if it could not be written (nothing published).
            ReplayTimeoutError: if not published within ``timeout`` (it is still written).
            ServerUnavailableError: if the server did not answer.
        """
        timeout = check_timeout(timeout, none="wait until it is published")
        return str(self.transport.call({"op": "checkpoint"}, timeout=timeout)[0]["path"])

    def table(self, name: str) -> RemoteTable:
        """A :class:`RemoteTable`: the exact method signatures of a local :class:`Table`."""
        self.describe(name)
        return RemoteTable(self, name)

    def trajectory_writer(self, tables: str | Sequence[str], **kwargs: Any):
        """A :class:`RemoteTrajectoryWriter` streaming steps to ``tables``."""
        self.transport.check_open()
        return RemoteTrajectoryWriter(self, tables, **kwargs)

    def sample_iterator(self, table: str, batch_size: int, **kwargs: Any):
        """A :class:`SampleIterator` keeping several sample requests in flight."""
        self.transport.check_open()
        return SampleIterator(self, table, batch_size, **kwargs)

    def __repr__(self) -> str:
        return f"Client({self.address!r})"


class RemoteTable:
    """A served table with the same calls as a local :class:`~rlreplay.Table`.

    Example:
        >>> replay = Client(address).table("replay")              # doctest: +SKIP
        >>> batch = replay.sample(256, timeout=5.0)               # doctest: +SKIP
    """

    def __init__(self, client: Client, name: str):
        self.client, self.name = client, name

    @property
    def layout(self):
        """The table's :class:`~rlreplay.ItemLayout` (``layout.span`` and its windows)."""
        from types import SimpleNamespace

        from rlreplay.core.layout import ItemLayout

        desc = self.client.describe(self.name)
        try:
            return ItemLayout.from_json(desc["layout"], self.client.signature(self.name))
        except Exception:  # unknown layout kind: its span still holds
            return SimpleNamespace(span=desc["span"])

    def insert(self, rows, priorities=None, *, timeout=None) -> np.ndarray:
        return self.client.insert(self.name, rows, priorities, timeout=timeout)

    def sample(self, batch_size: int, *, timeout: float | None = None) -> Sample:
        return self.client.sample(self.name, batch_size, timeout=timeout)

    def update_priorities(self, keys, priorities) -> int:
        return self.client.update_priorities(self.name, keys, priorities)

    def delete(self, keys) -> int:
        return self.client.delete(self.name, keys)

    def reset(self) -> None:
        self.client.reset(self.name)

    def info(self) -> TableInfo:
        return self.client.info(self.name)

    def can_insert(self, num_inserts: int = 1) -> bool:
        return self.client.can_insert(self.name, num_inserts)

    def can_sample(self, num_samples: int = 1) -> bool:
        return self.client.can_sample(self.name, num_samples)

    def __len__(self) -> int:
        return self.info().size

    def __repr__(self) -> str:
        return f"RemoteTable({self.name!r} at {self.client.address!r})"


def insert_request(
    tables: ServedTables, table: str, rows: Mapping[str, Any], priorities: Any, until: Any
) -> tuple[dict, dict]:
    """``(header, arrays)`` of an insert into ``table``, checked against its signature.

    Raises:
        SignatureError, InvalidArgumentError: for refused rows or priorities, or table.
    """
    sig = tables.signature(table, until)
    arrays = rows_arrays(sig, rows, tables.describe(table, until)["is_rows"], table)
    header: dict[str, Any] = {"op": "insert", "table": table}
    if priorities is not None:
        n = len(next(iter(arrays.values())))
        arrays["priorities"] = check_priorities(priorities, n)
    return header, arrays


def sample_request(table: str, batch_size: Any, update: Any) -> tuple[dict, dict]:
    """``(header, arrays)`` of a sample request carrying ``update`` (or ``None``).

    Raises:
        InvalidArgumentError: for a malformed ``update``.
    """
    header = {"op": "sample", "table": table, "batch_size": plain_int(batch_size)}
    if update is None:
        return header, {}
    if not isinstance(update, tuple) or len(update) != 2:
        raise InvalidArgumentError(
            f"update={describe(update)} must be a (keys, priorities) pair or None"
        )
    return header, update_arrays(*update, prefix="update/")


def plain_int(value: Any) -> Any:
    """A numpy integer as a Python int; anything else unchanged, for the server to check."""
    return int(value) if isinstance(value, np.integer) else value
