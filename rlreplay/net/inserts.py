"""Pipelined inserts: :meth:`Client.insert` without a round trip per call.

A thread's inserts go out on its own socket, in order with its other requests. A single
row is sent at once while no insert message of the thread awaits acknowledgement
(``IN_FLIGHT``) and the last one left at least ``COALESCE_S`` (0.2 ms) ago; otherwise single
rows wait in this process, coalesced into one message (at most ``MAX_BATCH_ROWS`` rows,
``MAX_BATCH_BYTES`` bytes, and what the table's rate limiter admits at once), which leaves
with the first call once both hold again, or when it is full and fewer than
``MAX_IN_FLIGHT`` messages are out. So a slow loop sends each row at once, and a loop that
inserts faster sends about one message per round trip (or per 0.2 ms), however fast the
server answers: the messages grow instead of their count, with no timer and no extra
thread. Sending a row whenever fewer than two messages were out made, on a server that
answers quickly, messages of one or two rows, whose cost (not the rows') bound the loop:
measured here in one run, 22k-35k rows/s then, 80k-228k with these rules (client CPU per
row 16-22 us then, 4.3 us now; the server's 10-19 us then, 2-2.5 us now).

Rows still held go out before any other request of the same thread (``sample``, ``info``,
...), with :meth:`InsertPipeline.flush`, with ``Client.close()`` and at interpreter exit,
so a thread always reads its own writes. Errors are never lost: a message the server
refused (a rate limiter timeout, a table reset meanwhile, the server gone or restarted)
raises its typed error from the thread's next call, or from ``flush``, saying how many rows
were not inserted; a message refused is applied by no server later (request ids, epochs and
expiry times, see ``docs/protocol.md``). Every call takes all of its rows or none: it is
checked completely, and waits it needs (for room when ``MAX_IN_FLIGHT`` messages are out
and a message is full) happen before it takes anything.

Here is the sending, receiving and waiting (:class:`InsertPipeline`, one per thread);
the checks of a call's rows and the table's limits are :mod:`rlreplay.net.insert_rows`,
the messages held and the receipts returned :mod:`rlreplay.net.insert_receipts`.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlreplay.core.keys import check_priorities
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    ReplayError,
    ReplayTimeoutError,
    ServerUnavailableError,
)
from rlreplay.net import wire
from rlreplay.net.insert_receipts import InsertBatch, InsertReceipt
from rlreplay.net.insert_rows import (  # noqa: F401 (the limits and the plan, named here too)
    MAX_BATCH_BYTES,
    MAX_BATCH_ROWS,
    InsertPlan,
    batch_rows,
    single_row,
)

if TYPE_CHECKING:
    from rlreplay.net.channel import Channel
    from rlreplay.net.transport import Transport

log = logging.getLogger("rlreplay.net")

IN_FLIGHT = 1  # insert messages out before single rows are held and coalesced
MAX_IN_FLIGHT = 2  # insert messages out at most: a full message or a batch call waits
# Single rows are also held for this long after a message went out (seconds): a server that
# answers within it would otherwise get a message of one or two rows each time.
COALESCE_S = 0.0002
EXIT_FLUSH_S = 5.0  # seconds spent at interpreter exit sending the rows still held


def discard(pipeline: InsertPipeline) -> None:
    """``pipeline``'s socket was closed: nothing of it is sent at exit. Rows it still held
    or awaited are logged as lost (another thread's, or this thread's when it left a
    ``with`` block by an error or its flush at ``close`` failed)."""
    _OPEN.discard(pipeline)
    held = pipeline.open.n if pipeline.open is not None else 0
    sent = pipeline.held_rows - held
    if held or sent:
        log.warning(
            "closing the client dropped %d inserted row(s) not yet sent and %d sent but not "
            "acknowledged (these may be stored or not); flush() before closing to know",
            held,
            sent,
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
        self.open: InsertBatch | None = None  # single rows held, not yet sent
        self.in_flight: deque[InsertBatch] = deque()
        self.failed: list[InsertBatch] = []  # refused, not yet raised to the caller
        self.sent_at = -math.inf  # time.monotonic() when the last message went out
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
        self.check_thread()
        row = single_row(plan, rows) if plan.cap else None
        if row is None:
            arrays, n = batch_rows(plan, rows, priorities)
            return self._add_batch(plan, arrays, n, timeout, until)
        prio = None
        if priorities is not None:
            kind = type(priorities)
            if (kind is float or kind is np.float64) and 0.0 <= priorities < math.inf:
                prio = float(priorities)  # what check_priorities accepts, without an array
            else:
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
            b = self.open = InsertBatch(plan, timeout, has_prio)
        for parts, value in zip(b.parts, row):
            parts.append(value)
        if has_prio:
            b.prios.append(prio)
        b.n += 1
        receipt = InsertReceipt(self, b, b.n - 1, b.n)
        if len(self.in_flight) < IN_FLIGHT and time.monotonic() - self.sent_at >= COALESCE_S:
            self._send_open(until)
        return receipt

    def _add_batch(
        self, plan: InsertPlan, arrays: dict, n: int, timeout: float | None, until: float | None
    ) -> InsertReceipt:
        """A call with a batch axis: its own message, after the rows held."""
        self.raise_failed(receive=True)
        if self.open is not None:
            self._make_room(until)
            self._send_open(until)
        self._make_room(until)
        b = InsertBatch(plan, timeout, "priorities" in arrays)
        b.arrays, b.n = arrays, n
        self.open = b
        self._send_open(until)
        return InsertReceipt(self, b, 0, n)

    # ---------------------------------------------------------------- sending
    def _make_room(self, until: float | None) -> None:
        """Wait while ``MAX_IN_FLIGHT`` messages are out (raising what the server refused)."""
        while len(self.in_flight) >= MAX_IN_FLIGHT:
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
        self.sent_at = time.monotonic()

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

    def _resolve(self, b: InsertBatch, header: dict, arrays: dict) -> None:
        if b in self.in_flight:
            self.in_flight.remove(b)
        if header.get("ok"):
            b.keys = arrays["keys"]
        else:
            self._fail(b, wire.error_from_code(header.get("code"), str(header.get("message", ""))))

    def _fail(self, b: InsertBatch, exc: ReplayError) -> None:
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

    def _report(self, batches: list[InsertBatch]) -> ReplayError:
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
    def wait_for(self, batch: InsertBatch, timeout: float | None) -> None:
        """Wait until ``batch`` is answered (sending it first if it is held)."""
        self.check_thread()
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
        self.check_thread()
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

    def check_thread(self) -> None:
        """Check that the caller is the thread (and process) that inserted: the answers
        arrive on that thread's socket, which only it may read.

        Raises:
            ClosedError: in another process (a forked child).
            InvalidArgumentError: in another thread.
        """
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
