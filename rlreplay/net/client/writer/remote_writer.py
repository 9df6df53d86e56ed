"""The remote writer: the TrajectoryWriter interface over the network, in chunks.

Invariant: every call takes all of its input or none of it, so a call that timed out can be
repeated: a call hands over what is due (it may wait or raise) before taking anything, and the
chunks it fills on the way are only queued, never sent. Errors of a chunk (a limiter's timeout,
refused items) surface from the later call that waits for its acknowledgement.
Items are made when their chunk reaches the server, so :meth:`create_item`
returns ``None``; chunks are stored whole, once (:mod:`rlreplay.net.client.writer.chunks`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from rlreplay.core.specs import Signature
from rlreplay.errors import ClosedError, ReplayTimeoutError, ServerUnavailableError, check_timeout
from rlreplay.net.client.transport import REPLY_GRACE_S, Sender
from rlreplay.net.client.writer.chunks import ChunkStream, discard_open, register_open, wait_time
from rlreplay.net.client.writer.items import PendingItems, check_writer_args
from rlreplay.net.client.writer.steps import StepBuffer


class WriterClient(Protocol):
    """What a remote writer needs of its client (a :class:`~rlreplay.Client`)."""

    address: str

    transport: Sender

    def describe(self, table: str) -> dict[str, Any]: ...

    def signature(self, table: str) -> Signature: ...

    def table(self, name: str) -> Any: ...


class RemoteTrajectoryWriter:
    """Writes one stream of steps to served tables that share a step store.

    Args:
        client: the :class:`~rlreplay.Client`.
        tables: table name(s) items will be created in.
        history: steps an item may reach back (default: the longest item span).
        chunk_steps: steps per message; default 1024, or less for a small store.
        max_in_flight: unacknowledged chunks allowed before the writer waits.
        timeout: default seconds a call waits for the server (``None``: no limit).
        keep_keys: collect the keys of acknowledged items in :attr:`keys`.

    Raises:
        InvalidArgumentError: for unknown tables, a table named twice, tables on different
            stores, or bad sizes.

    Example:
        >>> with client.trajectory_writer("replay") as writer:          # doctest: +SKIP
        ...     writer.append({"obs": obs, "action": a, "reward": r})
        ...     writer.create_item("replay", priority=1.0)
    """

    def __init__(
        self,
        client: WriterClient,
        tables: str | Sequence[str],
        *,
        history: int | None = None,
        chunk_steps: int | None = None,
        max_in_flight: int = 4,
        timeout: float | None = None,
        keep_keys: bool = False,
    ):
        names, self.spans, variable, history, chunk_steps, max_items = check_writer_args(
            client, tables, history, chunk_steps, max_in_flight
        )
        self.client = client
        self.table_names = names
        self.signature = client.signature(names[0])
        self.history = history
        self._pending = PendingItems(names, self.spans, variable, history, max_items)
        self.max_in_flight = max_in_flight
        self.timeout = check_timeout(timeout)
        self._chunks = ChunkStream(
            client.transport,
            {"tables": names, "history": history},
            max_in_flight,
            self._dropped_until,
        )
        self._chunks.keys = [] if keep_keys else None
        self._steps = StepBuffer(self.signature, chunk_steps)
        self._stream = 0  # stream index of the next step
        self._chunk_first = 0
        self._episode_start = 0
        self._episode_starts: list[int] = []
        self._closed = False
        register_open(self)

    @property
    def chunk_steps(self) -> int:
        """Steps per chunk (fixed when the writer is made)."""
        return self._steps.capacity

    @property
    def open_here(self) -> bool:
        """Whether this writer is open and was made in this process."""
        return not self._closed and self._chunks.pid == os.getpid()

    @property
    def tables(self) -> list:
        """Handles of the writer's tables (``name`` and ``layout`` like local tables)."""
        return [self.client.table(n) for n in self.table_names]

    @property
    def episode_steps(self) -> int:
        """Retained steps of the current episode an item may start at."""
        return min(self.history, self._stream - self._episode_start)

    def append(self, step: Mapping[str, Any], *, timeout: float | None = None) -> int:
        """Buffer one step; returns its stream index.

        Args:
            step: one value per signature field.
            timeout: seconds to wait when chunks go out first (``None``: the writer's).

        Raises:
            SignatureError: if the step does not match the signature.
            ClosedError: if the writer is closed.
            ReplayTimeoutError: if chunks sent first were late (RateLimiterTimeoutError when a
                limiter held them); the step was not taken.
            ServerUnavailableError: if the server stopped answering; the step was not taken.
        """
        self._check_open()
        if timeout is not None:
            timeout = check_timeout(timeout)
        steps = self._steps
        full = steps.n >= steps.capacity
        if full or self._chunks.unsent:
            # a full chunk goes out at the next step, so items over its last steps go with it
            self._hand_over(timeout, full)
        steps.add(step)
        self._stream += 1
        return self._stream - 1

    def append_batch(self, steps: Mapping[str, Any], *, timeout: float | None = None) -> int:
        """Buffer consecutive steps (each field ``[n, ...]``), all or none; returns the first's
        stream index.

        Raises:
            SignatureError, InvalidArgumentError: for steps that do not match the signature.
            ClosedError: if the writer is closed.
            ReplayTimeoutError: as :meth:`append`; no step was taken.
        """
        self._check_open()
        timeout = check_timeout(timeout)
        buffer = self._steps
        arrays, n = buffer.check_batch(steps)
        full = buffer.n >= buffer.capacity
        if full or self._chunks.unsent:
            self._hand_over(timeout, full)
        first = self._stream
        done = 0
        while done < n:
            if buffer.n >= buffer.capacity:
                self._seal()
            take = min(n - done, buffer.capacity - buffer.n)
            buffer.add_rows(arrays, done, take)
            self._stream += take
            done += take
        return first

    def create_item(
        self,
        table: str,
        priority: float | None = None,
        *,
        start: int | None = None,
        length: int | None = None,
        timeout: float | None = None,
    ) -> None:
        """Create an item over recent steps (made when the chunk reaches the server). Args as
        :meth:`rlreplay.TrajectoryWriter.create_item`; ``timeout`` as in :meth:`append`.

        Raises:
            InvalidArgumentError: as the local writer's (checked before sending).
            ReplayTimeoutError: as :meth:`append`; the item was not taken.
        """
        self._check_open()
        if timeout is not None:
            timeout = check_timeout(timeout)
        full = self._pending.full
        if full or self._chunks.unsent:
            # bad arguments are refused before any wait
            self._pending.check(table, priority, start, length, self._stream, self._episode_start)
            # a chunk is stored whole: send the full one first, so a failure changes nothing
            self._hand_over(timeout, full)
        stream, episode = self._stream, self._episode_start
        if (
            start is None
            and length is None
            and self._pending.add_latest(table, priority, stream, episode)
        ):
            return  # the common case, checked fast
        self._pending.add(table, priority, start, length, stream, episode)

    def create_items(
        self,
        table: str,
        priorities: Any = None,
        *,
        starts: Any,
        lengths: Any = None,
        timeout: float | None = None,
    ) -> None:
        """Batch form of :meth:`create_item`, all items or none.

        Args:
            table: one of the writer's tables (name or handle).
            priorities: one per item, one for all, or ``None`` (default).
            starts: negative indexes into this episode's retained steps.
            lengths: per-item lengths (``None``: the layout's span).
            timeout: as in :meth:`append`.

        Raises:
            InvalidArgumentError: as :meth:`create_item`; no item is taken then.
            ReplayTimeoutError: as :meth:`append`; no item was taken.
        """
        self._check_open()
        timeout = check_timeout(timeout)
        full = self._pending.full
        if full or self._chunks.unsent:
            # bad arguments are refused before any wait
            self._pending.check_all(
                table, priorities, starts, lengths, self._stream, self._episode_start
            )
            self._hand_over(timeout, full)
        stream, episode = self._stream, self._episode_start
        self._pending.add_all(table, priorities, starts, lengths, stream, episode)
        while self._pending.over:
            self._seal()

    def end_episode(self) -> None:
        """End the current episode: later items cannot reach the steps before this call.

        Raises:
            ClosedError: after :meth:`close`.
        """
        self._check_open()
        if self._stream != self._episode_start:
            self._episode_start = self._stream
            self._episode_starts.append(self._stream)
            self._pending.end_episode(self._stream)

    @property
    def keys(self) -> list[np.ndarray] | None:
        """Keys of acknowledged items, one array per chunk (with ``keep_keys=True``)."""
        return self._chunks.keys

    @property
    def items_acknowledged(self) -> int:
        """Items the server has acknowledged so far."""
        return self._chunks.acknowledged

    @property
    def pending_chunks(self) -> int:
        """Chunks not yet acknowledged by the server (sent, or kept to send again)."""
        return self._chunks.pending

    def _seal(self) -> None:
        """Queue the buffered steps and up to a chunk's worth of items as a chunk."""
        n = self._steps.n
        if n or self._pending.items:
            first = self._chunk_first
            arrays = self._steps.take(self._pending.next_items())  # raises: nothing changed
            self._pending.take()
            starts = [s for s in self._episode_starts if first <= s < first + n]
            self._chunks.queue(first, n, starts, arrays)
            self._episode_starts = [s for s in self._episode_starts if s >= first + n]
            self._chunk_first = first + n

    def _hand_over(self, timeout: float | None, seal: bool) -> None:
        """Queue the buffer (with ``seal``) and send queued chunks, waiting at most
        ``timeout`` plus the reply grace (ReplayTimeoutError: the chunks stay queued)."""
        timeout = self.timeout if timeout is None else timeout
        end = None if timeout is None else time.monotonic() + timeout + REPLY_GRACE_S
        if seal:
            self._seal()
        self._chunks.send(timeout, wait_time(timeout, end), end)

    def _dropped_until(self, end: int) -> int:
        """A chunk ending at ``end`` was refused: a new episode starts there."""
        self._episode_start = max(self._episode_start, min(end, self._stream))
        return self._pending.drop_before(end)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered and wait until the server has stored it; a chunk not
        stored in time is kept for the next ``flush`` (never stored twice).

        Args:
            timeout: seconds to wait (rate limiters included); ``None``: no limit.

        Raises:
            RateLimiterTimeoutError: if the server's limiter kept a chunk blocked.
            ReplayTimeoutError: if acknowledgements did not arrive within ``timeout`` plus
                ``REPLY_GRACE_S`` (0.5 s); also for a chunk blocked by a limiter that an
                earlier call sent with a longer timeout. Catch it for both.
            ServerUnavailableError: if the server stopped answering.
            InvalidArgumentError: if the server refused a chunk's items (the chunk is dropped).
        """
        self._check_open()
        timeout = check_timeout(timeout)
        end = None if timeout is None else time.monotonic() + timeout + REPLY_GRACE_S
        while self._steps.n or self._pending.items:
            self._seal()
        limit = self.timeout if timeout is None else timeout
        chunks = self._chunks
        chunks.send(limit, wait_time(limit, end), end)
        while chunks.in_flight:
            left = wait_time(None, end)
            if left is not None and left <= 0:
                chunks.requeue()
                raise ReplayTimeoutError(
                    f"flush waited {timeout}s; {chunks.pending} chunk(s) not yet stored (the "
                    "writer keeps them and sends them again with its next flush())"
                )
            chunks.wait_oldest(left)

    def _check_open(self) -> None:
        """Raise ClosedError if this writer, or its client, was closed."""
        if self._closed:
            raise ClosedError("the writer is closed")
        if self.client.transport.closed:
            raise ClosedError(
                f"the client of this writer ({self.client.address}) was closed; create a new "
                "Client and writer"
            )

    def close(self, timeout: float | None = None) -> None:
        """Flush (waiting up to ``timeout``) and release the server-side stream state.

        The writer is closed even if the flush raises (as :meth:`flush` does); chunks still
        held are then lost.
        """
        if self._closed:
            return
        reachable = True
        try:
            held = self._steps.n + self._chunks.pending_steps
            if held or not self.client.transport.closed:  # (else nothing to send)
                self.flush(timeout)
        except ServerUnavailableError:
            reachable = False  # nothing to tell a server that does not answer
            raise
        finally:
            self._closed = True
            discard_open(self)
            if reachable:
                self._chunks.close()

    def __del__(self) -> None:
        chunks = getattr(self, "_chunks", None)
        if getattr(self, "_closed", True) or chunks is None or chunks.pid != os.getpid():
            return
        held = self._steps.n + chunks.pending_steps
        warnings.warn(
            f"RemoteTrajectoryWriter for {self.table_names} was never closed: {held} steps and "
            "their items it still held are lost. Use it as a context manager or call close() "
            "(at exit, writers still open are flushed for a few seconds).",
            ResourceWarning,
            stacklevel=2,
        )

    def __enter__(self) -> RemoteTrajectoryWriter:
        self._check_open()
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True
            discard_open(self)
