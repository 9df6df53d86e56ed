"""The replay server: hosts in-process tables behind one ZeroMQ ROUTER socket.

One dispatcher thread owns the socket and runs every table call; calls a rate limiter
blocks are parked, so no thread ever waits on a table, and ``NOBLOCK`` replies mean one slow
client never stalls the others. See docs/server.md and docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterable
from typing import Any

import zmq

from rlreplay.core.table import Table
from rlreplay.errors import ClosedError, InvalidArgumentError
from rlreplay.net.server.checkpoints import ServerCheckpoints
from rlreplay.net.server.limits import ClientLedger, check_limit
from rlreplay.net.server.operations import ServerOperations, served_tables
from rlreplay.net.server.parking import ParkedCalls
from rlreplay.net.server.replies import Replies
from rlreplay.net.server.request_handler import RequestHandler
from rlreplay.net.server.sessions import MAX_WRITERS_PER_CLIENT, WriterSessions
from rlreplay.net.server.shm import SharedSegments
from rlreplay.net.wire import auth, framing

log = logging.getLogger("rlreplay.net")

CHECKPOINT_STOP_S = 5.0  # seconds a stopping server waits for a checkpoint under way
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


class Server:
    """Serve ``tables`` to :class:`rlreplay.Client` processes.

    Args:
        tables: the tables to host (unique names; they may share step stores).
        port: TCP port; ``None`` picks a free one (see :attr:`address` after ``start()``).
        bind: host to bind (default loopback ``"127.0.0.1"``), or an ``ipc://`` path.
        curve_secret_key: the server's ``.key_secret`` file (``rlreplay keygen``); enables CURVE.
        authorized_keys: folder of client public ``.key`` files allowed (default: any client).
        insecure: allow binding a non-loopback address without CURVE (logged loudly).
        metrics_port: serve Prometheus metrics on this port (needs ``prometheus-client``).
        recheck_s: longest interval between re-checks of parked calls, seconds.
        max_message_bytes: largest request accepted, all frames together; clients learn it.
        max_unread_bytes: unread reply bytes held per client before its requests are refused
            (:class:`~rlreplay.errors.ResourceLimitError`).
        max_parked_per_client: calls of one client that may wait parked at once.
        parked_expiry_s: a call parked without a timeout is dropped (ReplayTimeoutError)
            once its client sent nothing this long, or sooner when its socket's lease ends.
        max_writers_per_client: remote writers one client may keep; a new one closes its
            least recently used idle writer, or is refused (ResourceLimitError).
        checkpoint_dir: where checkpoints are saved (:meth:`Client.checkpoint`, periodic) and
            the newest valid one restored by ``start()``.
        checkpoint_every_s: seconds between checkpoints (``None``: on request only).
        keep_checkpoints: how many of the newest checkpoints to keep (``None``: all).

    Attributes:
        address: ``tcp://host:port`` (or the ``ipc://`` path) bound by ``start()``; ``None``
            before.

    Raises:
        InvalidArgumentError: for bad ``tables``, ``bind`` or limits, a non-loopback ``bind``
            without ``curve_secret_key`` or ``insecure=True``, or bad checkpoint options.

    Example:
        >>> with Server([table]) as server:                       # doctest: +SKIP
        ...     client = Client(server.address)
        ...     client.sample("replay", 32)
    """

    def __init__(
        self,
        tables: Iterable[Table],
        port: int | None = None,
        bind: str = "127.0.0.1",
        *,
        curve_secret_key: str | None = None,
        authorized_keys: str | None = None,
        insecure: bool = False,
        metrics_port: int | None = None,
        recheck_s: float = 0.05,
        max_message_bytes: int = 1 << 30,
        max_unread_bytes: int = 256 << 20,
        max_parked_per_client: int = 1000,
        parked_expiry_s: float = 300.0,
        max_writers_per_client: int = MAX_WRITERS_PER_CLIENT,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every_s: float | None = None,
        keep_checkpoints: int | None = None,
    ):
        check_limit("max_message_bytes", max_message_bytes, 1024, integer=True)
        check_limit("max_unread_bytes", max_unread_bytes, 0, integer=True)
        check_limit("max_parked_per_client", max_parked_per_client, 1, integer=True)
        check_limit("parked_expiry_s", parked_expiry_s, 0.001)
        check_limit("max_writers_per_client", max_writers_per_client, 1, integer=True)
        self.checkpoints = ServerCheckpoints(checkpoint_dir, checkpoint_every_s, keep_checkpoints)
        self.tables = served_tables(tables)
        self.endpoint = auth.endpoint(bind, port)
        self._loopback = auth.is_loopback(self.endpoint)
        if not self._loopback and curve_secret_key is None and not insecure:
            raise InvalidArgumentError(
                f"bind={bind!r} is not a loopback address: give curve_secret_key= (keys from "
                "`rlreplay keygen`) so clients must authenticate, or insecure=True to serve "
                "without authentication on purpose"
            )
        self.curve_secret_key = curve_secret_key
        self.authorized_keys = authorized_keys
        self.insecure = insecure
        self.metrics_port = metrics_port
        self.recheck_s = recheck_s
        self.max_message_bytes = max_message_bytes
        self.parked_expiry_s = float(parked_expiry_s)
        self.clients = ClientLedger(max_unread_bytes, max_parked_per_client)
        # drawn at each start, so clients notice a restart
        self.epoch: int | None = None
        self.address: str | None = None
        self._ctx: zmq.Context | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.replies = Replies(self.clients)
        self._parked = ParkedCalls(
            self.clients,
            self.parked_expiry_s,
            self.replies.ok,
            self.replies.error,
            self.replies.reachable,
            self.replies.notice,
        )
        self._sessions = WriterSessions(max_writers_per_client)
        self._shm = SharedSegments()  # clients' shared memory for sample replies
        self.operations = ServerOperations(
            self.tables, self._sessions, self._shm, self.checkpoints, max_message_bytes,
            self._parked,
        )
        self._requests = RequestHandler(
            self.operations,
            self.clients,
            self.replies,
            self._parked,
            self._shm,
            max_message_bytes,
        )
        self._metrics_server = None
        self._changed: ChangeSignal | None = None  # made at start
        self._dispatcher: int | None = None  # the dispatcher thread's ident

    def _table_changed(self, store: Any) -> None:
        """A served store changed: wake the dispatcher if a parked call may go (any thread, the
        store's lock held)."""
        if (
            self._parked
            and threading.get_ident() != self._dispatcher
            and self._parked.may_go(store)
        ):
            self._changed.signal()  # type: ignore[union-attr]

    def start(self) -> Server:
        """Bind the socket and serve in a background thread; returns ``self``.

        With a ``checkpoint_dir``, the newest valid checkpoint is restored first.

        Raises:
            ClosedError: if the server was already started.
            CheckpointError: if checkpoints are there but none is valid and matches.
            AddressInUseError: if another socket holds the address.
            InvalidArgumentError: if the address cannot be bound, or a key file is bad.
        """
        if self._thread is not None:
            raise ClosedError("the server was already started; create a new Server")
        self.checkpoints.restore(self.tables, self._sessions)
        self._ctx = zmq.Context()
        self._auth = None
        self.epoch = secrets.randbits(63)
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.setsockopt(zmq.RCVHWM, 1000)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        # A send to a client whose connection is gone fails (see Replies.reachable).
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            if self.curve_secret_key is not None:
                self._auth = auth.start_curve(
                    self._ctx, sock, self.curve_secret_key, self.authorized_keys
                )
            self.address = auth.bind(sock, self.endpoint)
        except Exception:
            sock.close()
            self._shutdown_context()
            raise
        if self.curve_secret_key is None and not self._loopback:
            log.warning(
                "serving %s WITHOUT authentication or encryption (insecure=True): anyone who "
                "can reach this address can read and change the tables",
                self.address,
            )
        self._wake = self._ctx.socket(zmq.PAIR)
        self._wake.bind(f"inproc://rlreplay-wake-{id(self)}")
        self._changed = ChangeSignal()
        self._sock = self.replies.sock = sock
        self.replies.epoch = self._requests.epoch = self.epoch
        self._thread = threading.Thread(target=self._run, name="rlreplay-server", daemon=True)
        self._thread.start()
        while not self._started.wait(0.1):  # the dispatcher registers, then serves
            if not self._thread.is_alive():
                raise RuntimeError(
                    f"the server's dispatcher thread on {self.address} ended before serving; "
                    "its error is printed above"
                )
        if self.metrics_port is not None:
            from rlreplay.net.server import metrics

            self._metrics_server = metrics.serve(self, self.metrics_port)
        log.debug("rlreplay server on %s serving %s", self.address, list(self.tables))
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: parked calls get ClosedError replies, sockets close. Idempotent;
        waits up to ``timeout`` seconds for the serving thread to end."""
        if self._thread is None or self._stopping.is_set():
            if self._thread is not None:
                self._thread.join(timeout)
            return
        self._stopping.set()
        waker = self._ctx.socket(zmq.PAIR)
        try:
            waker.connect(f"inproc://rlreplay-wake-{id(self)}")
            # never block: an exited dispatcher leaves no peer
            waker.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:  # zmq.Again included: the thread is gone or stops by itself
            pass
        finally:
            waker.close(linger=0)
        self._thread.join(timeout)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self._shutdown_context()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (or ``timeout`` seconds); True if it stopped."""
        if self._thread is None:
            return True
        end = None if timeout is None else time.monotonic() + timeout
        while self._thread.is_alive():
            left = 0.2 if end is None else min(0.2, end - time.monotonic())
            if left <= 0:
                return False
            self._thread.join(left)
        return True

    def _shutdown_context(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        sock, wake = self._sock, self._wake
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        changed = self._changed
        assert changed is not None
        poller.register(changed.fileno(), zmq.POLLIN)
        self._dispatcher = threading.get_ident()
        stores = {id(t.store): t.store for t in self.tables.values()}.values()
        wakers = [(store, functools.partial(self._table_changed, store)) for store in stores]
        for store, waker in wakers:
            store.add_waker(waker)
        self._started.set()
        next_snapshot = 0.0
        checkpoints = self.checkpoints
        handle = self._requests.handle
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                if checkpoints.enabled:
                    checkpoints.tick(self.tables, self._sessions, now)
                if now >= next_snapshot:
                    self._snapshot(now)
                    next_snapshot = now + 1.0
                wait = next_snapshot - now
                if now < checkpoints.next_due:  # wake for a periodic checkpoint when due
                    wait = min(wait, checkpoints.next_due - now)
                if self._parked:
                    wait = min(wait, self.recheck_s)
                    deadline = self._parked.next_deadline()
                    if deadline is not None:
                        wait = min(wait, max(0.0, deadline - now))
                if checkpoints.capturing:  # its next steps come after what waits now
                    wait = 0.0
                events = dict(poller.poll(int(wait * 1000) + 1))
                if changed.fileno() in events:
                    changed.drain()
                if sock in events:
                    # EVENTS is cheaper than the exception of an empty non-blocking receive
                    for _ in range(256):
                        if not sock.getsockopt(_EVENTS) & _POLLIN:
                            break
                        if handle(framing.receive(sock)):
                            checkpoints.changed = True
                if self._parked:
                    # expire first: after a stall, a call past its deadline must not run
                    self._parked.expire(time.monotonic())
                    self._parked.retry()
                    self._parked.watch(time.monotonic())
        except zmq.ContextTerminated:
            pass
        except BaseException as exc:  # keep the reason for the log
            self._error = exc
            log.exception("rlreplay server dispatcher failed")
        finally:
            for store, waker in wakers:
                store.remove_waker(waker)
            changed.close()
            self._parked.close(ClosedError("the server is stopping"))
            self._shm.clear()
            checkpoints.close(CHECKPOINT_STOP_S)
            sock.close(linger=0)
            wake.close(linger=0)

    def table_stats(self, name: str) -> dict[str, Any]:
        """``TableInfo`` of table ``name`` as a dict plus recent rates."""
        return self.operations.table_stats(name)

    def _snapshot(self, now: float) -> None:
        """Once a second: the tables' rates, and what idle clients left behind."""
        self.operations.record_rates(now)
        self._sessions.forget_idle(now)
        self._shm.forget_idle(now)
        self.clients.prune()


class ChangeSignal:
    """A wake-up the dispatcher polls, safe to give from any thread (a pipe byte)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def fileno(self) -> int:
        return self._read

    def signal(self) -> None:
        with contextlib.suppress(OSError):  # full (already signalled) or closed
            os.write(self._write, b"\0")

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)

