"""The replay client: the calls of a local :class:`rlreplay.Table`, served by a Server.

A client is a cheap handle. It opens its socket lazily in the process that uses it, and it
pickles as its address (plus CURVE keys), so it can be handed to another process or a Ray
actor and reconnects there.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zmq

from rlreplay.core.sample import Sample
from rlreplay.core.specs import Signature
from rlreplay.core.table_checks import check_timeout
from rlreplay.core.table_info import TableInfo
from rlreplay.errors import (
    InvalidArgumentError,
    ReplayTimeoutError,
    ServerUnavailableError,
    describe,
)
from rlreplay.net import auth, wire
from rlreplay.net.channel import Channel
from rlreplay.net.payloads import as_sample, rows_arrays, update_arrays

# Extra seconds a client waits past a call's timeout for the server's own timeout reply.
REPLY_GRACE_S = 0.5


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
        liveness_s: while a call waits without a timeout, the server is pinged after this
            many silent seconds, and declared unavailable after twice as many.

    Raises:
        InvalidArgumentError: for a malformed address or unreadable key files.

    Example:
        >>> client = Client(server.address)                       # doctest: +SKIP
        >>> keys = client.insert("replay", {"obs": obs_batch})    # doctest: +SKIP
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
    ):
        self.address = auth.normalize_address(address)
        self._server_key = auth.public_key(server_public_key)
        self._client_keys = auth.client_keys(client_secret_key) if self._server_key else None
        self.call_timeout = check_timeout(call_timeout)
        self.liveness_s = float(liveness_s)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._channels: list[Channel] = []
        self._ids = itertools.count(1)
        self._descriptions: dict[str, dict] | None = None

    # ------------------------------------------------------------ pickling
    def __getstate__(self) -> dict:
        return {
            "address": self.address,
            "server_public_key": self._server_key,
            "client_secret_key": self._client_keys,
            "call_timeout": self.call_timeout,
            "liveness_s": self.liveness_s,
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    # -------------------------------------------------------------- socket
    def _channel(self) -> Channel:
        """This thread's socket and reply bookkeeping (opened on first use per process)."""
        ch = getattr(self._local, "channel", None)
        if ch is None or ch.pid != os.getpid():
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 1000)
            sock.setsockopt(zmq.RCVHWM, 1000)
            if self._server_key is not None:
                sock.curve_serverkey = self._server_key
                sock.curve_publickey, sock.curve_secretkey = self._client_keys
            if auth.is_ipv6(self.address):
                sock.setsockopt(zmq.IPV6, 1)
            sock.connect(self.address)
            ch = self._local.channel = Channel(sock)
            with self._lock:
                self._channels = [c for c in self._channels if c.pid == ch.pid] + [ch]
        return ch

    def close(self) -> None:
        """Close this process's sockets (a later call opens new ones)."""
        with self._lock:
            for ch in self._channels:
                if ch.pid == os.getpid():
                    ch.sock.close(linger=0)
            self._channels = []
        self._local = threading.local()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- messaging
    def _send(self, header: dict, arrays: Mapping[str, np.ndarray] | None = None) -> int:
        """Send a request without waiting; returns its id."""
        rid = next(self._ids)
        header["id"] = rid
        frames = wire.encode(header, arrays)
        sock = self._channel().sock
        try:
            sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            if not sock.poll(int(self.call_timeout * 1000), zmq.POLLOUT):
                raise ServerUnavailableError(
                    f"could not send to {self.address} for {self.call_timeout}s"
                ) from None
            sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        return rid

    def _wait(self, rid: int, timeout: float | None) -> tuple[dict, dict]:
        """Wait for the reply to ``rid``; raise its typed error if it failed.

        Args:
            timeout: seconds to wait; ``None`` waits as long as the server answers pings.
                A ping goes out ``REPLY_GRACE_S`` before a bounded wait ends, to tell a
                live but busy server (ReplayTimeoutError) from a dead one.

        Raises:
            ServerUnavailableError: if the server did not answer at all.
            ReplayTimeoutError: if the server answers but this call did not complete.
        """
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        last_ping = ping_sent = -float("inf")
        ch = self._channel()
        while rid not in ch.replies:
            now = time.monotonic()
            if deadline is not None:
                if now >= deadline:
                    ch.abandoned.add(rid)
                    if ch.last_heard > ping_sent:
                        raise ReplayTimeoutError(
                            f"the replay server at {self.address} answers, but this call "
                            f"did not complete within {timeout:.3g}s"
                        )
                    raise ServerUnavailableError(
                        f"no reply from the replay server at {self.address} within "
                        f"{timeout:.3g}s (server down, unreachable, or rejecting this "
                        "client's credentials)"
                    )
                if deadline - now <= REPLY_GRACE_S and ping_sent < start:
                    ping_sent = now
                    ch.abandoned.add(self._send({"op": "ping"}))
                wait = deadline - now
                if ping_sent < start:
                    wait -= REPLY_GRACE_S
            else:
                silent = now - max(ch.last_heard, start)
                if silent >= 2 * self.liveness_s:
                    ch.abandoned.add(rid)
                    raise ServerUnavailableError(
                        f"the replay server at {self.address} stopped answering "
                        f"({silent:.3g}s without a reply to a ping)"
                    )
                if silent >= self.liveness_s and now - last_ping >= self.liveness_s:
                    ch.abandoned.add(self._send({"op": "ping"}))
                    last_ping = now
                wait = self.liveness_s
            if ch.wait(wait):
                ch.receive()
        header, arrays = ch.replies.pop(rid)
        if not header.get("ok"):
            raise wire.error_from_code(header.get("code"), str(header.get("message", "")))
        return header, arrays

    def _call(
        self, header: dict, arrays: Mapping[str, np.ndarray] | None = None, timeout: Any = "call"
    ) -> tuple[dict, dict]:
        wait = self.call_timeout if timeout == "call" else timeout
        if timeout != "call":
            header["timeout"] = timeout
            wait = None if timeout is None else timeout + REPLY_GRACE_S
        return self._wait(self._send(header, arrays), wait)

    # ---------------------------------------------------------- table calls
    def ping(self, timeout: float = 5.0) -> list[str]:
        """Names of the served tables; raises ServerUnavailableError if none answers."""
        return list(self._wait(self._send({"op": "ping"}), timeout)[0]["tables"])

    def describe(self, table: str) -> dict[str, Any]:
        """Signature, layout and sizes of ``table`` (cached)."""
        if self._descriptions is None:
            self._descriptions = self._call({"op": "describe"})[0]["tables"]
        if table not in self._descriptions:
            raise InvalidArgumentError(
                f"table {describe(table)} is not served at {self.address}; tables: "
                f"{sorted(self._descriptions)}"
            )
        return self._descriptions[table]

    def signature(self, table: str) -> Signature:
        return Signature.from_json(self.describe(table)["signature"])

    def insert(
        self,
        table: str,
        rows: Mapping[str, Any],
        priorities: Any = None,
        *,
        timeout: float | None = None,
    ) -> np.ndarray:
        """:meth:`Table.insert` on the server's ``table``; returns the new keys."""
        arrays = rows_arrays(self.signature(table), rows, self.describe(table)["is_rows"], table)
        header: dict[str, Any] = {"op": "insert", "table": table}
        if priorities is not None:
            if np.ndim(priorities) == 0:
                header["priority"] = float(priorities)
            else:
                arrays["priorities"] = np.asarray(priorities, dtype=np.float64)
        return self._call(header, arrays, check_timeout(timeout))[1]["keys"]

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
            ServerUnavailableError: if the server does not answer (then whether the update
                was applied is unknown).
        """
        rid = self.sample_async(table, batch_size, timeout=timeout, update=update)
        return self.sample_result(rid, timeout)

    def sample_async(
        self,
        table: str,
        batch_size: int,
        *,
        timeout: float | None = None,
        update: tuple[Any, Any] | None = None,
    ) -> int:
        """Send a sample request (and ``update``, see :meth:`sample`) without waiting.

        Returns:
            The request's id, for :meth:`sample_result`.

        Raises:
            InvalidArgumentError: for an invalid timeout, or an update whose keys are not
                integers or whose priorities are not numbers.
        """
        timeout = check_timeout(timeout)
        header = {"op": "sample", "table": table, "batch_size": batch_size, "timeout": timeout}
        if update is None:
            return self._send(header)
        if not isinstance(update, tuple) or len(update) != 2:
            raise InvalidArgumentError(
                f"update={describe(update)} must be a (keys, priorities) pair or None"
            )
        return self._send(header, update_arrays(*update, prefix="update/"))

    def sample_result(self, rid: int, timeout: float | None = None) -> Sample:
        """The sample requested as ``rid`` (waits up to ``timeout`` + a short grace)."""
        wait = None if timeout is None else timeout + REPLY_GRACE_S
        return as_sample(*self._wait(rid, wait))

    def update_priorities(self, table: str, keys: Any, priorities: Any, *, wait: bool = True):
        """:meth:`Table.update_priorities`; with ``wait=False`` returns at once (None) and
        the server only logs errors. A learner can instead send the update with its next
        sample request (``sample(..., update=(keys, priorities))``) and save a round trip."""
        arrays = update_arrays(keys, priorities)
        header: dict[str, Any] = {"op": "update_priorities", "table": table}
        if not wait:
            header["noreply"] = True
            self._send(header, arrays)
            return None
        return int(self._call(header, arrays)[0]["count"])

    def delete(self, table: str, keys: Any) -> int:
        """:meth:`Table.delete`; returns how many items were removed."""
        return int(
            self._call({"op": "delete", "table": table}, {"keys": np.asarray(keys)})[0]["count"]
        )

    def reset(self, table: str) -> None:
        """:meth:`Table.reset` on the server's ``table``."""
        self._call({"op": "reset", "table": table})

    def can_insert(self, table: str, num_inserts: int = 1) -> bool:
        return bool(self._call({"op": "can_insert", "table": table, "n": num_inserts})[0]["result"])

    def can_sample(self, table: str, num_samples: int = 1) -> bool:
        return bool(self._call({"op": "can_sample", "table": table, "n": num_samples})[0]["result"])

    def info(self, table: str) -> TableInfo:
        """:meth:`Table.info` of the server's ``table``."""
        stats = self.server_info(table)[table]
        return TableInfo(**{k: v for k, v in stats.items() if k in TableInfo.__dataclass_fields__})

    def server_info(self, table: str | None = None) -> dict[str, dict[str, Any]]:
        """Per table: TableInfo fields plus ``inserts_per_s``, ``samples_per_s`` and the
        observed ``samples_per_insert``."""
        header = {"op": "info"} if table is None else {"op": "info", "table": table}
        return self._call(header)[0]["tables"]

    # -------------------------------------------------------------- helpers
    def table(self, name: str):
        """A :class:`RemoteTable`: the exact method signatures of a local :class:`Table`."""
        from rlreplay.net.remote_table import RemoteTable

        self.describe(name)
        return RemoteTable(self, name)

    def trajectory_writer(self, tables: str | Sequence[str], **kwargs: Any):
        """A :class:`RemoteTrajectoryWriter` streaming steps to ``tables``."""
        from rlreplay.net.writer import RemoteTrajectoryWriter

        return RemoteTrajectoryWriter(self, tables, **kwargs)

    def sample_iterator(self, table: str, batch_size: int, **kwargs: Any):
        """A :class:`SampleIterator` keeping several sample requests in flight."""
        from rlreplay.net.iterator import SampleIterator

        return SampleIterator(self, table, batch_size, **kwargs)

    def __repr__(self) -> str:
        return f"Client({self.address!r})"
