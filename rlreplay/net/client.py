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
# The server must not start a request later than this before its client gives up, leaving
# the reply time to arrive.
EXPIRY_MARGIN_S = 0.25


class _CallTimeout:
    """``timeout`` of calls that never block: they wait ``Client.call_timeout``."""

    def __repr__(self) -> str:
        return "CALL"


CALL: Any = _CallTimeout()


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
    def _connect(self) -> zmq.Socket:
        """A new DEALER socket connected to the server."""
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
        return sock

    def _channel(self) -> Channel:
        """This thread's socket and reply bookkeeping (opened on first use per process)."""
        ch = getattr(self._local, "channel", None)
        if ch is None or ch.pid != os.getpid():
            ch = self._local.channel = Channel(self._connect)
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
    def _until(self, timeout: Any) -> float | None:
        """When a call with ``timeout`` gives up: ``CALL`` (``call_timeout``) or seconds
        the server may block it (plus ``REPLY_GRACE_S``), as a ``time.monotonic()`` value;
        None (no timeout) waits as long as the server answers pings."""
        if timeout is CALL:
            return time.monotonic() + self.call_timeout
        return None if timeout is None else time.monotonic() + timeout + REPLY_GRACE_S

    def _send(
        self,
        header: dict,
        arrays: Mapping[str, np.ndarray] | None = None,
        *,
        until: Any = CALL,
        expires: float | None = None,
        timeout: Any = CALL,
    ) -> int:
        """Send a request without waiting for its reply; returns its id.

        Before the first request on a socket, a ping learns the server's epoch, its clock
        and its message size limit. Each request is stamped with the epoch, so a
        restarted server refuses requests meant for its predecessor.

        Args:
            until: ``time.monotonic()`` by which the request must be on its way (the
                handshake and a full send queue included); None: as long as the server
                answers pings; default: ``call_timeout`` from now.
            expires: ``time.monotonic()`` after which the server must not start the
                request (this client stops waiting for it then); None: no such limit.
            timeout: seconds the server may block the request, sent as ``"timeout"``,
                shortened to what is left before ``until`` (default: the header's own).

        Raises:
            ServerUnavailableError: if the server did not answer the handshake or take the
                request before ``until`` (the request is then dropped, never sent later).
            InvalidArgumentError: if the request is larger than the server accepts.
        """
        if until is CALL:
            until = time.monotonic() + self.call_timeout
        ch = self._channel()
        ping = header.get("op") == "ping"
        if not ping and not ch.greeted:
            self._wait_until(self._send({"op": "ping"}, until=until), until)
            ch.greeted = True
        if timeout is not CALL:
            if timeout is not None and until is not None:
                # the server gives up (and answers) before this client does
                timeout = max(min(timeout, until - REPLY_GRACE_S - time.monotonic()), 1e-6)
            header["timeout"] = timeout
        rid = next(self._ids)
        header["id"] = rid
        if ch.epoch is not None and not ping:
            header["epoch"] = ch.epoch
        if expires is not None:
            # In the server's clock, early by at most a round trip; a margin is left for
            # the reply to travel back before this client gives up.
            header["expires"] = expires - EXPIRY_MARGIN_S + ch.clock_offset
        frames = wire.encode(header, arrays)
        if arrays and ch.max_message_bytes is not None:
            self._check_size(frames, ch.max_message_bytes)
        sock = ch.sock
        try:
            sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            left = 2 * self.liveness_s if until is None else until - time.monotonic()
            if left <= 0 or not sock.poll(max(1, int(left * 1000)), zmq.POLLOUT):
                message = f"could not send to {self.address} within {max(left, 0):.3g}s"
                ch.reset(message)
                raise ServerUnavailableError(message) from None
            sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        ch.sent(rid)
        return rid

    def _check_size(self, frames: list, limit: int) -> None:
        size = sum(f.nbytes if isinstance(f, np.ndarray) else len(f) for f in frames)
        if size > limit:
            raise InvalidArgumentError(
                f"this request is {size} bytes, more than the server at {self.address} accepts "
                f"(max_message_bytes={limit}); send fewer rows or steps per call"
            )

    def _wait(self, rid: int, timeout: float | None) -> tuple[dict, dict]:
        """Wait up to ``timeout`` seconds for the reply to ``rid`` (see :meth:`_wait_until`)."""
        return self._wait_until(rid, None if timeout is None else time.monotonic() + timeout)

    def _wait_until(self, rid: int, until: float | None) -> tuple[dict, dict]:
        """Wait for the reply to ``rid``; raise its typed error if it failed.

        Args:
            until: ``time.monotonic()`` to give up at; ``None`` waits as long as the server
                answers pings. A ping goes out ``REPLY_GRACE_S`` before a bounded wait
                ends, to tell a live but busy server (ReplayTimeoutError) from a dead one.

        Raises:
            ServerUnavailableError: if the server did not answer at all. The socket is
                then dropped with everything still queued in it, and every other request
                outstanding on it fails the same way: none of them is applied later.
            ServerRestartedError: if the server restarted since the request was sent.
            ReplayTimeoutError: if the server answers but this call did not complete.
        """
        start = time.monotonic()
        last_ping = ping_sent = -float("inf")
        ch = self._channel()
        while rid not in ch.replies:
            now = time.monotonic()
            silent = now - max(ch.last_heard, start)
            if until is not None and now >= until:
                if ch.last_heard > ping_sent:
                    ch.abandon(rid)
                    raise ReplayTimeoutError(
                        f"the replay server at {self.address} answers, but this call "
                        f"did not complete within {until - start:.3g}s"
                    )
                self._unavailable(
                    ch,
                    f"no reply from the replay server at {self.address} within "
                    f"{until - start:.3g}s (server down, unreachable, or rejecting this "
                    "client's credentials)",
                )
            if until is None and silent >= 2 * self.liveness_s:
                self._unavailable(
                    ch,
                    f"the replay server at {self.address} stopped answering "
                    f"({silent:.3g}s without a reply to a ping)",
                )
            wait = self.liveness_s
            if until is not None:
                if until - now <= REPLY_GRACE_S and ping_sent < start:
                    # the last ping tells a busy server from a dead one at the deadline
                    ping_sent = last_ping = now
                    ch.abandon(self._send({"op": "ping"}, until=until))
                wait = min(wait, until - now - (REPLY_GRACE_S if ping_sent < start else 0.0))
            if silent >= self.liveness_s and now - last_ping >= self.liveness_s:
                # pings while waiting also reveal a restarted server (its epoch)
                last_ping = now
                ch.abandon(self._send({"op": "ping"}, until=until))
            if ch.wait(wait):
                ch.receive()
        header, arrays = ch.replies.pop(rid)
        if not header.get("ok"):
            raise wire.error_from_code(header.get("code"), str(header.get("message", "")))
        return header, arrays

    def _unavailable(self, ch: Channel, message: str) -> None:
        """Drop the channel's socket and queued requests; raise ServerUnavailableError."""
        ch.reset(message)
        raise ServerUnavailableError(message)

    def _call(
        self,
        header: dict,
        arrays: Mapping[str, np.ndarray] | None = None,
        timeout: Any = CALL,
        until: Any = CALL,
    ) -> tuple[dict, dict]:
        """Send a request and wait for its reply.

        Args:
            timeout: seconds the server may block the call (a rate limiter), ``None`` for
                no limit, or ``CALL`` for calls that never block (they wait
                ``call_timeout``).
            until: when the whole call gives up (default: from ``timeout``), so that work
                done before sending (a handshake, a description) counts against it too.
        """
        if until is CALL:
            until = self._until(timeout)
        rid = self._send(header, arrays, until=until, expires=until, timeout=timeout)
        return self._wait_until(rid, until)

    # ---------------------------------------------------------- table calls
    def ping(self, timeout: float = 5.0) -> list[str]:
        """Names of the served tables; raises ServerUnavailableError if none answers."""
        timeout = check_timeout(timeout)
        until = None if timeout is None else time.monotonic() + timeout
        return list(self._wait_until(self._send({"op": "ping"}, until=until), until)[0]["tables"])

    def describe(self, table: str) -> dict[str, Any]:
        """Signature, layout and sizes of ``table`` (cached)."""
        return self._describe(table, CALL)

    def _describe(self, table: str, until: Any) -> dict[str, Any]:
        """:meth:`describe`, fetched (once) within the caller's ``until``."""
        if self._descriptions is None:
            self._descriptions = self._call({"op": "describe"}, until=until)[0]["tables"]
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
        """:meth:`Table.insert` on the server's ``table``; returns the new keys.

        ``timeout`` bounds the whole call (fetching the table's description the first
        time included), plus ``REPLY_GRACE_S`` for the server's answer.

        Raises:
            InvalidArgumentError: for rows, priorities or a timeout that the table would
                refuse (nothing is sent).
            RateLimiterTimeoutError: if the rate limiter blocked the insert for ``timeout``.
            ServerUnavailableError: if the server did not answer (the insert was not
                applied and never will be; ServerRestartedError if it restarted).
        """
        timeout = check_timeout(timeout)
        until = self._until(timeout)
        desc = self._describe(table, until)
        sig = Signature.from_json(desc["signature"])
        arrays = rows_arrays(sig, rows, desc["is_rows"], table)
        header: dict[str, Any] = {"op": "insert", "table": table}
        if priorities is not None:
            try:
                prios = np.asarray(priorities, dtype=np.float64)
            except (TypeError, ValueError):
                raise InvalidArgumentError(
                    f"priorities={describe(priorities)} must be a number or one number per row"
                ) from None
            if prios.ndim == 0:
                header["priority"] = float(prios)
            else:
                arrays["priorities"] = prios
        return self._call(header, arrays, timeout, until)[1]["keys"]

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
        until = self._until(timeout)
        header, arrays = self._sample_request(table, batch_size, update)
        return as_sample(*self._call(header, arrays, timeout, until))

    def _sample_request(self, table: str, batch_size: Any, update: Any) -> tuple[dict, dict]:
        header = {"op": "sample", "table": table, "batch_size": _plain_int(batch_size)}
        if update is None:
            return header, {}
        if not isinstance(update, tuple) or len(update) != 2:
            raise InvalidArgumentError(
                f"update={describe(update)} must be a (keys, priorities) pair or None"
            )
        return header, update_arrays(*update, prefix="update/")

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
            ServerUnavailableError: if the request could not be sent within ``timeout``.
        """
        timeout = check_timeout(timeout)
        header, arrays = self._sample_request(table, batch_size, update)
        return self._send(header, arrays, until=self._until(timeout), timeout=timeout)

    def sample_result(self, rid: int, timeout: float | None = None) -> Sample:
        """The sample requested as ``rid`` (waits up to ``timeout`` + a short grace)."""
        return as_sample(*self._wait_until(rid, self._until(check_timeout(timeout))))

    def update_priorities(self, table: str, keys: Any, priorities: Any, *, wait: bool = True):
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
            self._send(header, arrays)
            return None
        return int(self._call(header, arrays)[0]["count"])

    def delete(self, table: str, keys: Any) -> int:
        """:meth:`Table.delete`; returns how many items were removed."""
        keys = update_arrays(keys, 0.0)["keys"]
        return int(self._call({"op": "delete", "table": table}, {"keys": keys})[0]["count"])

    def reset(self, table: str) -> None:
        """:meth:`Table.reset` on the server's ``table``."""
        self._call({"op": "reset", "table": table})

    def can_insert(self, table: str, num_inserts: int = 1) -> bool:
        """:meth:`Table.can_insert` on the server's ``table``."""
        header = {"op": "can_insert", "table": table, "n": _plain_int(num_inserts)}
        return bool(self._call(header)[0]["result"])

    def can_sample(self, table: str, num_samples: int = 1) -> bool:
        """:meth:`Table.can_sample` on the server's ``table``."""
        header = {"op": "can_sample", "table": table, "n": _plain_int(num_samples)}
        return bool(self._call(header)[0]["result"])

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


def _plain_int(value: Any) -> Any:
    """A numpy integer as a Python int (what the wire carries); anything else unchanged,
    for the server to check."""
    return int(value) if isinstance(value, np.integer) else value
