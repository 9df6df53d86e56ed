"""The replay client: the calls of a local :class:`rlreplay.Table`, served by a Server.

A client is a cheap handle. It opens its socket lazily in the process that uses it, and it
pickles as its address (plus CURVE keys), so it can be handed to another process or a Ray
actor and reconnects there. Once closed it stays closed, as a table or a writer does: its
calls raise :class:`~rlreplay.errors.ClosedError` (a copy unpickled elsewhere is a new,
open client).

Its parts: the settings it is made from and pickles as
(:mod:`rlreplay.net.client.settings`), the sockets and request ids
(:mod:`rlreplay.net.client.transport`), what it knows of the served tables
(:mod:`rlreplay.net.client.served_tables`) and the shared-memory path of sampled batches
(:mod:`rlreplay.net.client.shm`). The requests of calls that carry arrays are built and
checked here (:func:`insert_request`, :func:`sample_request`), in the caller's process,
before anything is sent, so a call the server would refuse for its form raises at once
and sends nothing.
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

    Each thread (and each process) gets its own socket, so a call blocked in one thread
    never holds up another; a request's reply is awaited by the thread that sent it.

    Every table call names its table first (``client.sample("replay", 256)``);
    :meth:`table` returns a handle whose methods match a local :class:`~rlreplay.Table`
    exactly, so code written against a table runs against a server unchanged.

    Args:
        address: ``tcp://host:port``, ``host:port`` or ``ipc:///path``.
        server_public_key: the server's public key (``.key`` file path or z85 bytes) for a
            CURVE-protected server.
        client_secret_key: this client's ``.key_secret`` file (its public key must be in the
            server's authorized folder); default: an ephemeral key pair.
        call_timeout: seconds to wait for calls that never block on a rate limiter
            (``info``, ``update_priorities``, ...) before :class:`ServerUnavailableError`.
        liveness_s: while a call waits without a timeout, the server is pinged after half
            this many silent seconds, and declared unavailable after twice as many.
        diagnose_timeout: seconds spent, after a call got no answer, watching a new
            connection's handshake to say why (0 to skip); a loaded machine may need more
            than the default to tell a refused credential from silence.
        shared_memory: whether sampled batches come through shared memory instead of the
            socket (same host only; see :mod:`rlreplay.net.client.shm`): ``None`` (default)
            for ``ipc://`` and loopback addresses where the server can map this
            process's segments, else the socket; ``False`` never; ``True`` always
            (:class:`~rlreplay.errors.InvalidArgumentError` where it cannot be used).

    Raises:
        InvalidArgumentError: for a malformed address or unreadable key files, a
            ``call_timeout``, ``liveness_s`` or ``diagnose_timeout`` that is not seconds in
            range, or ``shared_memory=True`` on a platform without ``/dev/shm`` (naming
            the argument; see :class:`~rlreplay.net.client.settings.ClientSettings`).

    A call that gets no answer raises :class:`~rlreplay.errors.ServerUnavailableError`
    within its timeout; the client then checks the connection (at most
    ``diagnose_timeout`` more, 0.25 s by default) and says why, where it can tell:
    nothing accepts connections at ``address``, or which CURVE credential the server
    refused (the error's ``reason``).

    Attributes:
        address: the server's address, as given.
        transport: the :class:`~rlreplay.net.client.transport.Transport` every request
            travels through: what this client's writers and iterators send on, and what a
            sharded client keeps requests in flight on over several servers.

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

    # ------------------------------------------------------------ pickling
    def __getstate__(self) -> dict:
        return self._settings.arguments(self.call_timeout)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    # --------------------------------------------------------- transport
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
        """Close this process's sockets. The client is closed for good: every later call
        raises :class:`~rlreplay.errors.ClosedError` (its writers' and iterators' calls
        too); closing again does nothing. It still pickles as its address: the copy is
        open."""
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------- table calls
    def ping(self, timeout: float | None = None) -> list[str]:
        """Names of the served tables, answered within ``timeout`` seconds (default: the
        client's ``call_timeout``); raises ServerUnavailableError if none answers."""
        timeout = self.transport.call_timeout if timeout is None else check_timeout(timeout)
        until = time.monotonic() + timeout
        tr = self.transport
        return list(tr.wait_until(tr.send({"op": "ping"}, until=until), until)[0]["tables"])

    def describe(self, table: str, *, until: Any = CALL) -> dict[str, Any]:
        """Signature, layout and sizes of ``table`` (fetched once, then cached).

        ``until``: the ``time.monotonic()`` by which the reply must come, a deadline
        shared with other calls (a sharded client's); default ``call_timeout`` from now.
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
        """:meth:`Table.insert` on the server's ``table``: one round trip, returning the
        new items' keys.

        The rows (and priorities) are checked against the table's signature in this
        process first, so a call the table would refuse sends nothing. To stream single
        steps, use :meth:`trajectory_writer` (it sends them in chunks, without a round
        trip per step).

        Args:
            table: the table's name.
            rows: one row (no batch axis) or rows with a leading batch axis.
            priorities: one per row, one for all, or ``None`` (the table's default).
            timeout: seconds the server's rate limiter may block these rows (``None``:
                no limit, while the server answers pings).
            until: the ``time.monotonic()`` by which the reply must come, a deadline
                shared with other calls (a sharded client's; ``None``: none); default:
                this call's own, from ``timeout``.

        Returns:
            int64 keys of the new items, as the server's table assigned them.

        Raises:
            SignatureError, InvalidArgumentError: for rows, priorities or a timeout the
                table refuses (nothing is stored).
            RateLimiterTimeoutError: if the limiter blocked the rows for ``timeout``
                (nothing is stored, and never will be).
            ServerUnavailableError: if the server did not answer (these rows are applied by
                no server later; ServerRestartedError if it restarted).
        """
        timeout = check_timeout(timeout)
        if until is CALL:
            until = self.transport.until(timeout)
        header, arrays = insert_request(self._tables, table, rows, priorities, until)
        return self.transport.call(header, arrays, timeout, until)[1]["keys"]

    # ------------------------------------------------------ a learner's calls
    # Sample requests, awaited or kept in flight, that may carry the previous batch's new
    # priorities (the server applies such an update before it samples: a learner's cycle
    # is one round trip), and priority updates sent on their own. Sampled batches come back
    # through shared memory where the client's SharedMemoryPath can use it, else through
    # the socket.
    def sample(
        self,
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
        until = self.transport.until(timeout)
        return self._shm.send_sample(header, arrays, until=until, expires=until, timeout=timeout)


    def sample_result(self, rid: int, timeout: float | None = None) -> Sample:
        """The sample requested as ``rid`` (waits up to ``timeout`` + a short grace)."""
        tr = self.transport
        return self._shm.sample(tr.wait_until(rid, tr.until(check_timeout(timeout))))


    def update_priorities(
        self, table: str, keys: Any, priorities: Any, *, wait: bool = True
    ) -> int | None:
        """:meth:`Table.update_priorities`: one priority per key, or one for all keys.

        With ``wait=False`` returns at once (None) and the server only logs errors; only
        a connection that has not yet greeted its server waits for that, at most the
        reply grace (``REPLY_GRACE_S``). A learner can instead send the update with its
        next sample request (``sample(..., update=(keys, priorities))``) and save a
        round trip.

        Returns:
            How many items were updated (keys of items no longer held are skipped).

        Raises:
            InvalidArgumentError: for keys or priorities the table refuses.
            ServerUnavailableError: if the server did not answer (with ``wait=False``:
                its greeting, within the reply grace).
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
        """Per table: TableInfo fields plus ``inserts_per_s``, ``samples_per_s`` and the
        observed ``samples_per_insert`` (``until`` as in :meth:`describe`)."""
        header = {"op": "info"} if table is None else {"op": "info", "table": table}
        return self.transport.call(header, until=until)[0]["tables"]

    def checkpoint(self, timeout: float | None = None) -> str:
        """Have the server save a checkpoint of all its tables and writer streams, and
        wait until it is published; returns its directory on the server's machine.

        The checkpoint holds everything the server acknowledged before this call (a
        checkpoint already under way is finished first). The server goes on serving
        meanwhile. Needs a server started with ``checkpoint_dir`` (``rlreplay serve
        --checkpoint-dir DIR``).

        Args:
            timeout: seconds to wait (``None``: as long as the server answers pings).

        Raises:
            InvalidArgumentError: if the server has no checkpoint directory.
            CheckpointError: if the checkpoint could not be written (nothing published).
            ReplayTimeoutError: if it was not published within ``timeout`` (the server
                goes on writing it).
            ServerUnavailableError: if the server did not answer.
        """
        timeout = check_timeout(timeout, none="wait until it is published")
        return str(self.transport.call({"op": "checkpoint"}, timeout=timeout)[0]["path"])

    # -------------------------------------------------------------- helpers
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
    """A served table with the same calls as a local :class:`~rlreplay.Table`, so code
    written against a table runs against a server unchanged (see :meth:`Client.table`).

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
        except Exception:  # a layout kind this client does not know: its span still holds
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
    """``(header, arrays)`` of an insert of ``rows`` into ``table``, checked against its
    signature (its description fetched, once, within ``until``).

    Raises:
        SignatureError, InvalidArgumentError: for rows or priorities the table refuses,
            or a table the server does not serve.
    """
    sig = tables.signature(table, until)
    arrays = rows_arrays(sig, rows, tables.describe(table, until)["is_rows"], table)
    header: dict[str, Any] = {"op": "insert", "table": table}
    if priorities is not None:
        n = len(next(iter(arrays.values())))
        arrays["priorities"] = check_priorities(priorities, n)
    return header, arrays


def sample_request(table: str, batch_size: Any, update: Any) -> tuple[dict, dict]:
    """``(header, arrays)`` of a sample of ``batch_size`` items (the server checks it),
    carrying ``update`` (``(keys, priorities)`` or ``None``).

    Raises:
        InvalidArgumentError: if ``update`` is not such a pair, or its keys are not
            integers or its priorities not numbers.
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
    """A numpy integer as a Python int (what the wire carries); anything else unchanged,
    for the server to check."""
    return int(value) if isinstance(value, np.integer) else value
