"""The replay server: hosts in-process tables behind one ZeroMQ ROUTER socket.

Concurrency model. One dispatcher thread owns the socket and runs every table call. Calls
that cannot block (``sample`` when the limiter admits it, ``update_priorities``, ``info``,
...) run at once. A call the rate limiter blocks is *parked*: it is kept in a list with its
deadline and attempted again after every request that changes a table, and at least every
``recheck_s`` seconds (for changes made by in-process users of the same tables). No thread
ever waits on a table's condition, so a parked call costs nothing while it waits, and
thousands of blocked clients need no threads. The choice over a pool of worker threads
waiting on the table's condition: with the interpreter lock, extra threads do not run
table code in parallel anyway, and a pool would bound how many calls can wait at once.

Replies go out with ``NOBLOCK``: a client that stops reading only loses its own replies once
its queue is full (ROUTER drops them), so one slow or dead client never stalls the others.

Faults. Every reply carries the server's *epoch*, a random number drawn at each start, so
a client notices a restart on the same address and fails the calls the old server took
(:class:`~rlreplay.errors.ServerRestartedError`). A request stamped with another epoch (sent
to the predecessor, still queued) is refused, as is one that arrives after the time its
client stops waiting (``expires``): a call that raised never takes effect later. What one
client may cost is bounded (:class:`~rlreplay.net.limits.ClientLedger`): message size, bytes
of unread replies, parked calls, and parked calls of clients that went silent.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable

import zmq

from rlreplay.core.table import Table
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    ReplayError,
    describe,
)
from rlreplay.net import auth, direct, framing, handlers, schema, wire
from rlreplay.net.checkpoints import ServerCheckpoints
from rlreplay.net.direct_server import DirectLinks
from rlreplay.net.limits import ClientLedger, check_envelope, check_lease, check_limit
from rlreplay.net.operations import TableOperations
from rlreplay.net.parking import ParkedCalls, cap_deadline, refuse_lapsed
from rlreplay.net.replies import OLDEST_VERSION, Replies
from rlreplay.net.sessions import MAX_WRITERS_PER_CLIENT, WriterSessions
from rlreplay.net.shm_server import SharedSegments

log = logging.getLogger("rlreplay.net")

CHECKPOINT_STOP_S = 5.0  # seconds a stopping server waits for a checkpoint under way
MUTATING = {"insert", "sample", "delete", "reset", "write", "update_priorities"}
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


class Server(TableOperations):
    """Serve ``tables`` to :class:`rlreplay.Client` processes.

    Args:
        tables: the tables to host (names must be unique; they may share step stores).
        port: TCP port; ``None`` picks a free one (see :attr:`address` after ``start()``).
        bind: host to bind (default loopback ``"127.0.0.1"``), or an ``ipc://`` path.
        curve_secret_key: server key file written by ``rlreplay keygen`` (the secret
            ``.key_secret`` file). Enables CURVE encryption and authentication.
        authorized_keys: folder of client public ``.key`` files allowed to connect; with
            CURVE and no folder, any client that knows the server's public key may connect.
        insecure: allow binding a non-loopback address without CURVE (logged loudly).
        metrics_port: serve Prometheus metrics on this port (needs ``prometheus-client``).
        recheck_s: longest interval between re-checks of parked calls.
        max_message_bytes: largest request accepted, all its frames together (a peer that
            sends a larger frame is disconnected by ZeroMQ's ``MAXMSGSIZE``; a larger request
            of several frames is refused). Clients learn it and refuse to send larger
            requests themselves.
        max_unread_bytes: bytes of replies the server holds for one client that does not
            read them; past it the client's requests are refused with
            :class:`~rlreplay.errors.ResourceLimitError` until it reads.
        max_parked_per_client: calls of one client that may wait on rate limiters at once;
            a further ``insert``/``sample``/``write`` is refused (ResourceLimitError).
        parked_expiry_s: a call parked *without* a timeout is dropped (answered with
            ReplayTimeoutError) once its client has sent nothing for this many seconds.
            Waiting clients ping every ``liveness_s`` (default 5 s), so only clients that
            vanished (or stopped reading for this long) lose their calls.
            Sooner, such a call is dropped once the latest lease of its client's socket
            (the time before which that client cannot have given up on this server) has
            passed: it is never applied after its client may have reported it failed.
        max_writers_per_client: remote writers one client may keep on the server; a new
            one beyond it closes that client's least recently used writer with no chunk
            waiting, or is refused (ResourceLimitError) when each has one (see
            :mod:`rlreplay.net.sessions`).
        checkpoint_dir, checkpoint_every_s, keep_checkpoints: ``start()`` restores the
            newest valid checkpoint in ``checkpoint_dir`` (tables and writer streams);
            one is saved there on request (:meth:`Client.checkpoint`) and every
            ``checkpoint_every_s`` seconds (``None``: on request only), keeping the newest
            ``keep_checkpoints`` (``None``: all); see :mod:`rlreplay.net.checkpoints`.
        direct_calls: offer same-host clients a direct link for their small awaited
            calls (a Unix socket the dispatcher polls; see :mod:`rlreplay.net.direct`);
            ``False``: every call through ZeroMQ.

    Raises:
        InvalidArgumentError: for ``tables`` that is not a list of tables, duplicate table
            names, a ``bind`` that holds a port, a non-loopback ``bind`` without
            ``curve_secret_key`` and without ``insecure=True``, or a limit that is not a
            positive number, or checkpoint options that are not valid.

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
        direct_calls: bool = True,
    ):
        check_limit("max_message_bytes", max_message_bytes, 1024, integer=True)
        check_limit("max_unread_bytes", max_unread_bytes, 0, integer=True)
        check_limit("max_parked_per_client", max_parked_per_client, 1, integer=True)
        check_limit("parked_expiry_s", parked_expiry_s, 0.001)
        check_limit("max_writers_per_client", max_writers_per_client, 1, integer=True)
        if not isinstance(direct_calls, bool):
            raise InvalidArgumentError(f"direct_calls={describe(direct_calls)} must be a bool")
        self.checkpoints = ServerCheckpoints(checkpoint_dir, checkpoint_every_s, keep_checkpoints)
        given, tables = tables, list(tables) if isinstance(tables, (list, tuple)) else None
        if tables is None and isinstance(given, Iterable) and not isinstance(given, str):
            tables = list(given)  # e.g. a dict's .values()
        if tables is None or not all(isinstance(t, Table) for t in tables):
            raise InvalidArgumentError(
                f"tables={describe(given)} must be a list of tables, e.g. Server([table])"
            )
        names = [t.name for t in tables]
        if not tables or len(set(names)) != len(names):
            raise InvalidArgumentError(f"tables {names} must be a non-empty list with unique names")
        self.tables = {t.name: t for t in tables}
        stores: list = []
        for t in tables:
            if not any(t.store is s for s in stores):
                stores.append(t.store)
        self._descriptions = {
            t.name: handlers.table_description(
                t, next(i for i, s in enumerate(stores) if s is t.store)
            )
            for t in tables
        }
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
        # Drawn at each start: replies carry it so that clients notice a restart.
        self.epoch: int | None = None
        self.address: str | None = None
        self._ctx: zmq.Context | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.replies = Replies(self.clients)
        self._parked = ParkedCalls(
            self.clients, self.parked_expiry_s, self.replies.ok, self.replies.error
        )
        self._sessions = WriterSessions(max_writers_per_client)
        self._shm = SharedSegments()  # clients' shared memory for sample replies
        self._caller = b""  # routing id of the client whose request is being served
        self._rates = {n: deque(maxlen=12) for n in self.tables}
        self._metrics_server = None
        self.direct_calls = direct_calls
        self._direct: DirectLinks | None = None  # the direct links, while serving
        self._ops = {name[4:]: getattr(self, name) for name in dir(self) if name.startswith("_op_")}

    # ----------------------------------------------------------- lifecycle
    def start(self) -> Server:
        """Bind the socket and start serving in a background thread; returns ``self``.

        With a ``checkpoint_dir``, the newest valid checkpoint there is restored into the
        tables (and the writers' streams) first.

        Raises:
            ClosedError: if the server was already started.
            CheckpointError: if the checkpoint directory holds checkpoints but none that
                is valid and matches the tables (nothing is restored; nothing served).
            AddressInUseError: if another socket holds the address (choose another port).
            InvalidArgumentError: if the address cannot be bound otherwise, or a key file
                is missing or malformed.
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
        if self.direct_calls and direct.supported():
            try:
                self._direct = DirectLinks()
            except OSError as exc:  # clients stay on ZeroMQ
                log.warning("serving without direct links: %s", exc)
        self._wake = self._ctx.socket(zmq.PAIR)
        self._wake.bind(f"inproc://rlreplay-wake-{id(self)}")
        self._sock = self.replies.sock = sock
        self.replies.epoch = self.epoch
        self._thread = threading.Thread(target=self._run, name="rlreplay-server", daemon=True)
        self._thread.start()
        self._started.wait()
        if self.metrics_port is not None:
            from rlreplay.net import metrics

            self._metrics_server = metrics.serve(self, self.metrics_port)
        log.info("rlreplay server on %s serving %s", self.address, list(self.tables))
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: parked calls get ClosedError replies, sockets close. Idempotent."""
        if self._thread is None or self._stopping.is_set():
            if self._thread is not None:
                self._thread.join(timeout)
            return
        self._stopping.set()
        waker = self._ctx.socket(zmq.PAIR)
        try:
            waker.connect(f"inproc://rlreplay-wake-{id(self)}")
            # Never block: a dispatcher that has already exited leaves no peer to take it.
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

    # ------------------------------------------------------------ dispatcher
    def _run(self) -> None:
        sock, wake = self._sock, self._wake
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        links = self._direct
        if links is not None:
            poller.register(links.fd, zmq.POLLIN)
            self._register = lambda fd: poller.register(fd, zmq.POLLIN)
            self._unregister = poller.unregister
        self._started.set()
        next_snapshot = 0.0
        checkpoints = self.checkpoints
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
                if sock in events:
                    # EVENTS says whether another message waits, which costs far less than
                    # the exception a non-blocking receive raises when none does.
                    for _ in range(256):
                        if not sock.getsockopt(_EVENTS) & _POLLIN:
                            break
                        if self._handle(framing.receive(sock)):
                            checkpoints.changed = True
                if links is not None and len(events) > (sock in events) + (wake in events):
                    self._serve_links(links, events)
                if self._parked:
                    # Expire first: a call past its deadline (or whose client went silent)
                    # must not be run by the retry after a long stall of this process.
                    self._parked.expire(time.monotonic())
                    self._parked.retry()
                    self._parked.watch(time.monotonic())
        except zmq.ContextTerminated:
            pass
        except BaseException as exc:  # keep the reason for the log
            self._error = exc
            log.exception("rlreplay server dispatcher failed")
        finally:
            self._parked.close(ClosedError("the server is stopping"))
            self._shm.clear()
            if links is not None:
                links.close()
            checkpoints.close(CHECKPOINT_STOP_S)
            sock.close(linger=0)
            wake.close(linger=0)

    def _serve_links(self, links: DirectLinks, events: dict) -> None:
        """Accept direct links and serve the requests waiting on them."""
        now = time.monotonic()
        for fd in events:
            if type(fd) is not int:
                continue
            if fd == links.fd:
                links.accept(self._register, self._unregister, now)
            elif links.serve(fd, self._handle, self._unregister, now):
                self.checkpoints.changed = True

    def _handle(self, frames: list) -> bool:
        """Serve one request; returns True if it may have changed a table."""
        identity, body = frames[0], frames[1:]
        rid = None
        version = OLDEST_VERSION  # what a request that cannot be read is answered in
        try:
            header = wire.decode_header(body)
            rid, version = header.get("id"), header["v"]
            if len(body) > 1 and sum(map(len, body)) > self.max_message_bytes:
                # ZeroMQ bounds each frame; this bounds the frames of a request together
                raise InvalidArgumentError(
                    f"the request is {sum(map(len, body))} bytes, more than this server's "
                    f"max_message_bytes={self.max_message_bytes}; send less per request"
                )
            arrays = wire.decode_arrays(header, body)
            client = identity.bytes
            now = time.monotonic()
            if "shm_in" in header:  # arrays a same-host client placed in its shared memory
                self._shm.request_arrays(client, header, arrays, self.epoch, now)
            op = schema.check_request(header, arrays)  # every field, before any handler
            method = self._ops[op]
            self.clients.heard(client, now)
            expires = check_envelope(header, op, self.epoch, now)
            lease = check_lease(header)
            if lease is not None:
                self.clients.renew(client, lease)
            self.clients.admit(client, op)
            self._caller = client
            result = method(header, arrays)
            if isinstance(result, handlers.Job):
                result.identity, result.rid, result.version = identity, rid, version
                cap_deadline(result, expires)
                refuse_lapsed(result, lease, now)
                reply = result.attempt()
                if reply is None:
                    self._parked.park(result, client, time.monotonic(), lease)
                else:
                    self.replies.ok(identity, rid, *reply, version)
            elif not header.get("noreply"):
                self.replies.ok(identity, rid, *result, version)
            return op in MUTATING
        except ReplayError as exc:
            self.replies.error(identity, rid, exc, version)
        except Exception as exc:
            log.exception("internal error serving a request")
            exc = ReplayError(f"internal server error: {exc!r}")
            self.replies.error(identity, rid, exc, version)
        return True

    def _op_shm_attach(self, header: dict, arrays: dict) -> tuple[dict, None]:
        """Map a same-host client's shared-memory segment (see :mod:`rlreplay.net.shm`)."""
        return self._shm.attach(self._caller, header, time.monotonic()), None

    def _op_shm_detach(self, header: dict, arrays: dict) -> tuple[dict, None]:
        return self._shm.detach(self._caller, header), None

    def _op_checkpoint(self, header: dict, arrays: dict) -> handlers.Job:
        deadline = handlers.deadline_of(header, time.monotonic())
        return self.checkpoints.request(deadline, self.tables, self._sessions)

    def _snapshot(self, now: float) -> None:
        for name, t in self.tables.items():
            lim = t.rate_limiter
            self._rates[name].append((now, lim.inserts, lim.samples))
        self._sessions.forget_idle(now)
        self._shm.forget_idle(now)
        if self._direct is not None:
            self._direct.sweep(now, self._register, self._unregister)
        self.clients.prune()
