"""Pipelined inserts: :meth:`Client.insert` without a round trip per call.

A thread's inserts go out on its own socket, in order with its other requests. Rows are
sent at once while fewer than ``IN_FLIGHT`` insert messages await acknowledgement;
otherwise single rows wait in this process, coalesced into one message (at most
``MAX_BATCH_ROWS`` rows, ``MAX_BATCH_BYTES`` bytes, and what the table's rate limiter admits
at once), which leaves with the first call after an acknowledgement arrives. So a fast
server sees one message per row (lowest latency), and a busy one sees batches (highest
throughput), with no timer and no extra thread.

Rows still held go out before any other request of the same thread (``sample``, ``info``,
...), with :meth:`InsertPipeline.flush`, with ``Client.close()`` and at interpreter exit,
so a thread always reads its own writes. Errors are never lost: a message the server
refused (a rate limiter timeout, a table reset meanwhile, the server gone or restarted)
raises its typed error from the thread's next call, or from ``flush``, saying how many rows
were not inserted; a message refused is applied by no server later (request ids, epochs and
expiry times, see ``docs/protocol.md``). Every call takes all of its rows or none: it is
checked completely, and waits it needs (for room when ``IN_FLIGHT`` messages are out and a
message is full) happen before it takes anything.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.core.specs import Signature
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    ReplayError,
    ReplayTimeoutError,
    ServerUnavailableError,
)
from rlreplay.net import wire
from rlreplay.net.payloads import rows_arrays

if TYPE_CHECKING:
    from rlreplay.net.channel import Channel
    from rlreplay.net.transport import Transport

log = logging.getLogger("rlreplay.net")

IN_FLIGHT = 2  # insert messages out before single rows are held and coalesced
MAX_BATCH_ROWS = 1024  # rows coalesced into one message at most
MAX_BATCH_BYTES = 1 << 20  # bytes of row data in one coalesced message at most
EXIT_FLUSH_S = 5.0  # seconds spent at interpreter exit sending the rows still held


class InsertPlan:
    """What a client needs to check and coalesce rows for one table (from ``describe``).

    Attributes:
        fields: ``(path, shape, dtype, scalar_check)`` per signature field.
        cap: most rows coalesced into one message for this table.
    """

    def __init__(self, name: str, desc: dict, max_message_bytes: int | None):
        self.name = name
        self.signature = Signature.from_json(desc["signature"])
        self.is_rows = bool(desc["is_rows"])
        self.max_size = int(desc["max_size"])
        self.lanes = int(desc.get("lanes", 1))
        self.fields = [
            (p, s.shape, s.dtype, _scalar_check(s.dtype) if not s.shape else None)
            for p, s in self.signature.fields.items()
        ]
        self.paths = set(self.signature.paths)
        row_bytes = max(1, self.signature.step_nbytes)
        limit = MAX_BATCH_BYTES
        if max_message_bytes is not None:
            limit = min(limit, max_message_bytes // 2)
        window = desc.get("insert_window")
        cap = min(MAX_BATCH_ROWS, self.max_size, max(1, limit // row_bytes))
        if window is not None:
            cap = min(cap, int(window))
        # a lane store takes whole rows of lanes only; single rows are never coalesced there
        self.cap = max(1, cap) if self.lanes == 1 else 0


def _scalar_check(dtype: np.dtype):
    """A fast test for a scalar field of ``dtype``: which Python and numpy scalar types
    the signature's casting rule admits unchanged (``None`` from the test: take the
    general path, which converts or refuses with the signature's own message)."""
    kind = dtype.kind
    numbers = (int, float, bool, np.bool_, np.integer, np.floating)  # never complex
    if kind == "b":
        return lambda v: type(v) is bool or type(v) is np.bool_
    if kind in "fc":
        # a Python int beyond 64 bits takes the general path (converted there or refused)
        return lambda v: (
            isinstance(v, numbers) and (type(v) is not int or -(2**63) <= v < 2**63)
        )
    info = np.iinfo(dtype)
    lo, hi = info.min, info.max

    def integer(v: Any) -> bool:
        t = type(v)
        if t is bool or t is np.bool_:
            return True
        return (t is int or isinstance(v, np.integer)) and lo <= v <= hi

    return integer


class _Batch:
    """Rows of one message: held (``rid`` None), sent, then acknowledged or failed."""

    __slots__ = ("arrays", "error", "keys", "n", "parts", "plan", "prio", "prios", "reported",
                 "rid", "timeout")  # fmt: skip

    def __init__(self, plan: InsertPlan, timeout: float | None, prio: bool):
        self.plan, self.timeout, self.prio = plan, timeout, prio
        self.parts: list[list] = [[] for _ in plan.fields]
        self.prios: list[float] = []
        self.arrays: dict | None = None  # a batched call's own arrays (never coalesced)
        self.n = 0
        self.rid: int | None = None
        self.keys: np.ndarray | None = None
        self.error: ReplayError | None = None
        self.reported = False

    def wire_arrays(self) -> dict[str, np.ndarray]:
        if self.arrays is not None:
            return self.arrays
        out = {}
        n = self.n
        for parts, (path, shape, dtype, _) in zip(self.parts, self.plan.fields):
            if shape:
                out["data/" + path] = np.frombuffer(b"".join(parts), dtype).reshape(n, *shape)
            else:
                out["data/" + path] = np.array(parts, dtype=dtype)
        if self.prio:
            out["priorities"] = np.array(self.prios, dtype=np.float64)
        return out


class InsertReceipt:
    """What a pipelined :meth:`Client.insert` returns: its rows, acknowledged later.

    ``keys()`` waits for the acknowledgement and returns the rows' keys (or raises the
    error that kept them out); ``done()`` says whether it arrived. Waiting for a receipt
    sends the rows still held first. A receipt is waited for in the thread that inserted.
    """

    __slots__ = ("_batch", "_pipeline", "_start", "_stop")

    def __init__(self, pipeline: InsertPipeline, batch: _Batch, start: int, stop: int):
        self._pipeline, self._batch, self._start, self._stop = pipeline, batch, start, stop

    def done(self) -> bool:
        """Whether the server answered (acknowledged, or refused) these rows.

        Raises:
            InvalidArgumentError: if called from another thread than the insert's (the
                answers arrive on that thread's socket, which only it may read).
        """
        b = self._batch
        self._pipeline._check_thread()
        if b.keys is None and b.error is None and b.rid is not None:
            self._pipeline.collect()
        return b.keys is not None or b.error is not None

    def keys(self, timeout: float | None = None) -> np.ndarray:
        """The rows' keys, waiting up to ``timeout`` seconds (``None``: while the server
        answers pings) for the acknowledgement.

        Raises:
            ReplayTimeoutError: if it did not arrive in time (the rows may still be stored;
                ask again).
            the error that kept the rows out (RateLimiterTimeoutError,
                ServerUnavailableError, InvalidArgumentError, ...).
            InvalidArgumentError: if called from another thread than the insert's.
        """
        self._pipeline.wait_for(self._batch, timeout)
        b = self._batch
        if b.error is not None:
            b.reported = True
            raise b.error
        return b.keys[self._start : self._stop]

    def __len__(self) -> int:
        return self._stop - self._start

    def __repr__(self) -> str:
        state = "done" if self._batch.keys is not None else "pending"
        if self._batch.error is not None:
            state = f"failed: {type(self._batch.error).__name__}"
        rows = self._stop - self._start
        return f"InsertReceipt({rows} rows of {self._batch.plan.name!r}, {state})"


def discard(pipeline: InsertPipeline) -> None:
    """``pipeline``'s socket was closed: nothing of it is sent at exit (rows it still
    held are logged as lost)."""
    _OPEN.discard(pipeline)
    if pipeline.held_rows and threading.get_ident() != pipeline.thread:
        log.warning(
            "closing the client dropped %d inserted row(s) another thread had not flushed",
            pipeline.held_rows,
        )


class InsertPipeline:
    """One thread's pipelined inserts over its channel (see the module docstring).

    Args:
        transport: sends and waits on the thread's channel.
        channel: the thread's :class:`~rlreplay.net.channel.Channel`.
    """

    def __init__(self, transport: Transport, channel: Channel):
        self.transport, self.channel = transport, channel
        self.thread = threading.get_ident()
        self.pid = os.getpid()
        self.open: _Batch | None = None  # single rows held, not yet sent
        self.in_flight: deque[_Batch] = deque()
        self.failed: list[_Batch] = []  # refused, not yet raised to the caller
        _OPEN.add(self)
        _register_exit()

    @property
    def waiting(self) -> bool:
        """Rows held to be sent, or refusals not yet raised."""
        return self.open is not None or bool(self.failed)

    @property
    def held_rows(self) -> int:
        """Rows given to insert and not yet acknowledged (held or in flight)."""
        held = self.open.n if self.open is not None else 0
        return held + sum(b.n for b in self.in_flight)

    # ----------------------------------------------------------------- adding
    def add(
        self,
        plan: InsertPlan,
        rows: Mapping[str, Any],
        priorities: Any,
        timeout: float | None,
        until: float | None,
    ) -> InsertReceipt:
        """Take the rows of one insert call (checked here; all or nothing).

        Raises:
            SignatureError, InvalidArgumentError: for rows or priorities the table refuses
                (nothing taken).
            the error of earlier rows the server refused (nothing taken).
            ReplayTimeoutError, ServerUnavailableError: if room for the rows did not come
                before ``until`` (nothing taken).
        """
        self._check_thread()
        row = self._single_row(plan, rows) if plan.cap else None
        if row is None:
            arrays = rows_arrays(plan.signature, rows, plan.is_rows, plan.name)
            n = len(next(iter(arrays.values())))
            if n < 1 or n > plan.max_size or n % plan.lanes:
                raise InvalidArgumentError(
                    f"rows hold {n} rows; insert between 1 and max_size={plan.max_size} at once"
                    + (f", a multiple of the store's lanes={plan.lanes}" if plan.lanes > 1 else "")
                )
            if priorities is not None:
                arrays["priorities"] = check_priorities(priorities, n)
            return self._add_batch(plan, arrays, n, timeout, until)
        prio = None
        if priorities is not None:
            prio = float(check_priorities(priorities, 1)[0])
        self.raise_failed(receive=True)
        b = self.open
        has_prio = prio is not None
        if b is not None and (
            b.plan is not plan or b.timeout != timeout or b.prio != has_prio or b.n >= plan.cap
        ):
            self._make_room(until)
            self._send_open(until)
            b = None
        if b is None:
            b = self.open = _Batch(plan, timeout, has_prio)
        for parts, value in zip(b.parts, row):
            parts.append(value)
        if has_prio:
            b.prios.append(prio)
        b.n += 1
        receipt = InsertReceipt(self, b, b.n - 1, b.n)
        if len(self.in_flight) < IN_FLIGHT:
            self._send_open(until)
        return receipt

    def _single_row(self, plan: InsertPlan, rows: Any) -> list | None:
        """One row's values to hold (array fields as bytes), or None when ``rows`` is
        not one row without a batch axis (then the general path checks it)."""
        if type(rows) is not dict or rows.keys() != plan.paths:
            return self._single_row_checked(plan, rows)
        values = []
        for path, shape, dtype, scalar_ok in plan.fields:
            v = rows[path]
            if shape:
                if type(v) is not np.ndarray or v.shape != shape or v.dtype != dtype:
                    return self._single_row_checked(plan, rows)
                values.append(v.tobytes())
            elif scalar_ok(v):
                values.append(v)
            elif type(v) is np.ndarray and v.shape == () and v.dtype == dtype:
                values.append(v[()])
            else:
                return self._single_row_checked(plan, rows)
        return values

    def _single_row_checked(self, plan: InsertPlan, rows: Any) -> list | None:
        """The general path for one row: the signature's own checks (and messages)."""
        if not isinstance(rows, Mapping):
            return None  # rows_arrays raises the signature's message
        first_path, _, _, _ = plan.fields[0]
        probe = rows.get(first_path) if "/" not in first_path else None
        if probe is None or np.ndim(probe) != len(plan.signature.fields[first_path].shape):
            return None  # a batch axis, or nested fields: the batch path
        flat = plan.signature.check_step(rows, "rows")
        values = []
        for path, shape, dtype, _ in plan.fields:
            arr = np.asarray(flat[path], dtype=dtype)
            values.append(arr.tobytes() if shape else arr[()])
        return values

    def _add_batch(
        self, plan: InsertPlan, arrays: dict, n: int, timeout: float | None, until: float | None
    ) -> InsertReceipt:
        """A call with a batch axis: its own message, after the rows held."""
        self.raise_failed(receive=True)
        if self.open is not None:
            self._make_room(until)
            self._send_open(until)
        self._make_room(until)
        b = _Batch(plan, timeout, "priorities" in arrays)
        b.arrays, b.n = arrays, n
        self.open = b
        self._send_open(until)
        return InsertReceipt(self, b, 0, n)

    # ---------------------------------------------------------------- sending
    def _make_room(self, until: float | None) -> None:
        """Wait while ``IN_FLIGHT`` messages are out (raising what the server refused)."""
        while len(self.in_flight) >= IN_FLIGHT:
            self._wait_oldest(until)
            self.raise_failed()

    def _send_open(self, until: float | None) -> None:
        """Send the rows held as one message (whatever is in flight)."""
        b = self.open
        if b is None:
            return
        self.open = None
        header: dict[str, Any] = {"op": "insert", "table": b.plan.name}
        expires = None
        if b.timeout is not None:
            expires = time.monotonic() + b.timeout + _grace()
        arrays = b.wire_arrays()
        b.parts, b.prios, b.arrays = [], [], None  # the message holds the rows now
        try:
            b.rid = self.transport.send(
                header,
                arrays,
                until=until,
                expires=expires,
                timeout=b.timeout,
                hooked=False,
            )
        except ReplayError as exc:
            self._fail(b, exc)
            raise self._report([b]) from None
        self.in_flight.append(b)

    def before_request(self, raise_failed: bool, until: float | None) -> None:
        """Another request of this thread goes out: send the rows held first (so the
        server takes them first; within that request's ``until``), and raise what the
        server refused (``raise_failed``)."""
        if self.open is not None:
            self._send_open(until)
        if raise_failed and self.failed:
            self.raise_failed()

    # -------------------------------------------------------------- receiving
    def collect(self) -> None:
        """Take the answers that arrived (no wait)."""
        ch = self.channel
        if ch.has_message():
            ch.receive()
        replies = ch.replies
        if not self.in_flight:
            return
        for b in list(self.in_flight):
            reply = replies.pop(b.rid, None)
            if reply is not None:
                self._resolve(b, *reply)

    def _resolve(self, b: _Batch, header: dict, arrays: dict) -> None:
        if b in self.in_flight:
            self.in_flight.remove(b)
        if header.get("ok"):
            b.keys = arrays["keys"]
        else:
            self._fail(b, wire.error_from_code(header.get("code"), str(header.get("message", ""))))

    def _fail(self, b: _Batch, exc: ReplayError) -> None:
        b.error = exc
        self.failed.append(b)

    def _wait_oldest(self, until: float | None) -> None:
        """Wait for the oldest message's answer until ``until``.

        Raises:
            ReplayTimeoutError: if it did not come in time (nothing is dropped).
        """
        b = self.in_flight[0]
        try:
            header, arrays = self.transport.wait_until(b.rid, until, abandon=False)
        except ReplayError as exc:
            if b.rid in self.channel.pending:
                raise  # this wait ran out (ReplayTimeoutError): the request is still out
            # Refused, or its socket was dropped with every request on it (all failed;
            # rows held, never sent, go out on the next socket).
            self.collect()
            if b in self.in_flight:
                self.in_flight.remove(b)
                self._fail(b, exc)
            return
        self._resolve(b, header, arrays)
        self.collect()

    def raise_failed(self, receive: bool = False) -> None:
        """Raise the error of rows the server refused, once (after a non-blocking look
        at the answers that arrived, with ``receive``)."""
        if receive and self.in_flight:
            self.collect()
        pending = [b for b in self.failed if not b.reported]
        self.failed = []
        if pending:
            raise self._report(pending)

    def _report(self, batches: list[_Batch]) -> ReplayError:
        for b in batches:
            b.reported = True
        rows = sum(b.n for b in batches)
        first = batches[0].error
        tables = sorted({b.plan.name for b in batches})
        what = f"{rows} row(s) of earlier insert calls to {', '.join(map(repr, tables))}"
        if isinstance(first, ServerUnavailableError):
            return type(first)(
                f"{what} were not acknowledged: {first} (rows that server took before may be "
                "stored; none is stored later)"
            )
        return type(first)(f"{what} were not inserted and never will be: {first}")

    # ---------------------------------------------------------------- waiting
    def wait_for(self, batch: _Batch, timeout: float | None) -> None:
        """Wait until ``batch`` is answered (sending it first if it is held)."""
        self._check_thread()
        until = None if timeout is None else time.monotonic() + timeout
        if batch is self.open:
            self._send_open(until)
        while batch.keys is None and batch.error is None:
            self.collect()
            if batch.keys is not None or batch.error is not None:
                break
            if batch not in self.in_flight:
                raise ReplayError("these rows were never sent (internal error)")
            self._wait_oldest(until)

    def flush(self, timeout: float | None = None) -> int:
        """Send the rows held and wait until every message is answered.

        Returns:
            Rows acknowledged by this wait (held or in flight when it began).

        Raises:
            ReplayTimeoutError: if answers did not all come within ``timeout`` seconds;
                nothing is dropped (the rows may still be stored; flush again).
            the error of rows the server refused (each error is raised once).
        """
        self._check_thread()
        until = None if timeout is None else time.monotonic() + timeout
        self._send_open(until)
        done = 0
        while self.in_flight:
            try:
                b = self.in_flight[0]
                self._wait_oldest(until)
            except ReplayTimeoutError:
                raise ReplayTimeoutError(
                    f"flush waited {timeout}s; {self.held_rows} inserted row(s) are not yet "
                    "acknowledged (they may still be stored: flush again)"
                ) from None
            done += b.n if b.keys is not None else 0
        self.raise_failed()
        return done

    def _check_thread(self) -> None:
        if self.pid != os.getpid():
            raise ClosedError(
                "these inserts were made in another process; a receipt belongs to the process "
                "(and thread) that inserted"
            )
        if threading.get_ident() != self.thread:
            raise InvalidArgumentError(
                "inserts are pipelined per thread: wait for them (receipt.keys(), "
                "client.flush()) in the thread that inserted"
            )


def _grace() -> float:
    from rlreplay.net.transport import REPLY_GRACE_S

    return REPLY_GRACE_S


# --------------------------------------------------------- rows held at exit
_OPEN: weakref.WeakSet = weakref.WeakSet()


def _flush_at_exit(budget_s: float = EXIT_FLUSH_S) -> None:
    """Send what every pipeline of this process still holds, for ``budget_s`` seconds in
    all (failures are logged, never raised)."""
    end = time.monotonic() + budget_s
    for p in list(_OPEN):
        if p.pid != os.getpid() or not (p.held_rows or p.failed):
            continue  # refusals read (by a receipt's done()) but never raised are reported
        try:
            p.thread = threading.get_ident()  # its thread has ended: exit runs on this one
            p.flush(max(0.001, end - time.monotonic()))
        except Exception as exc:  # at exit: report, never raise
            log.warning("at exit, rows inserted through a client were not stored: %s", exc)


atexit.register(_flush_at_exit)
_exit_registered: list[int] = []


def _register_exit() -> None:
    """Also flush when a ``multiprocessing`` child ends (it exits without ``atexit``)."""
    if os.getpid() in _exit_registered:
        return
    _exit_registered.append(os.getpid())
    from multiprocessing import util

    util.Finalize(None, _flush_at_exit, exitpriority=10)
