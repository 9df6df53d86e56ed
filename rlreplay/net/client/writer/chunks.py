"""The sending side of a remote writer: numbered chunks, acknowledged whole or sent again.

A chunk not stored in time is resent, with every later one, under the same numbers (never
applied twice); one refused for its content is dropped and later chunks start a new episode.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from rlreplay.errors import ClosedError, ReplayError, ReplayTimeoutError, ResourceLimitError
from rlreplay.net.client.transport import REPLY_GRACE_S, Sender

log = logging.getLogger("rlreplay.net")

# Chunks one writer may keep unacknowledged: the server keeps replies to this many
# (``ingest.KEPT_REPLIES``), so a chunk sent again is applied once.
MAX_IN_FLIGHT = 64

Queued = tuple[Any, dict, dict]  # (request id or None, header, arrays)


class ChunkStream:
    """Chunks of one writer, from queued to acknowledged.

    Args:
        sender: the client's sender (:attr:`rlreplay.Client.transport`).
        header: the fields every chunk carries (``tables``, ``history``).
        max_in_flight: chunks that may await acknowledgement at once.
        on_drop: ``on_drop(end)`` drops buffered items before a refused chunk's ``end``.
    """

    def __init__(
        self, sender: Sender, header: dict, max_in_flight: int, on_drop: Callable[[int], int]
    ):
        self.sender = sender
        # 128 random OS bits: unique whatever the program seeds, in every process
        self.id = secrets.token_bytes(16)
        self.pid = os.getpid()
        self.header = {"op": "write", "writer": self.id, **header}
        self.max_in_flight = max_in_flight
        self.on_drop = on_drop
        self.seq = 0  # number of the next chunk queued
        self.restart = False  # the next chunk queued starts a new episode
        self.in_flight: deque[Queued] = deque()
        self.unsent: deque[Queued] = deque()
        self.acknowledged = 0  # items acknowledged so far
        self.keys: list[np.ndarray] | None = None  # acknowledged keys, when kept

    @property
    def pending(self) -> int:
        """Chunks not yet acknowledged (sent, or queued to be sent again)."""
        return len(self.in_flight) + len(self.unsent)

    @property
    def pending_steps(self) -> int:
        return sum(int(h["n"]) for _, h, _ in (*self.in_flight, *self.unsent))

    def queue(self, first: int, n: int, starts: list[int], arrays: dict) -> None:
        """Queue a chunk of ``n`` steps from stream index ``first`` (not sent yet)."""
        header = dict(self.header, seq=self.seq, first=first, n=n, episode_starts=starts)
        if self.restart:
            header["restart"] = True
            self.restart = False
        self.seq += 1
        self.unsent.append((None, header, arrays))

    def send(self, timeout: float | None, wait: float | None, end: float | None) -> None:
        """Send every queued chunk, waiting ``wait`` s (or until ``end``) for the oldest
        while ``max_in_flight`` are out; the server may block each up to ``timeout``.

        Raises:
            ClosedError: in a process other than the writer's (a forked copy).
        """
        if self.pid != os.getpid():
            raise ClosedError(
                f"this writer was created in process {self.pid}; a writer belongs to the "
                "process that made it (its stream would be shared): create one per process"
            )
        while self.unsent:
            while len(self.in_flight) >= self.max_in_flight:
                self.wait_oldest(wait if end is None else max(0.0, end - time.monotonic()))
            _, header, arrays = self.unsent.popleft()
            header["timeout"] = timeout
            try:
                rid = _send(self.sender, dict(header), arrays, end)
            except BaseException:
                self.unsent.appendleft((None, header, arrays))
                raise
            self.in_flight.append((rid, header, arrays))

    def wait_oldest(self, wait: float | None) -> None:
        """Wait up to ``wait`` seconds (``None``: while the server answers pings) for the
        oldest chunk's acknowledgement.

        Raises:
            ReplayTimeoutError, ServerUnavailableError: not stored in time (kept, resent).
            InvalidArgumentError (or another ReplayError): refused; the chunk is dropped.
        """
        rid, header, arrays = self.in_flight[0]
        try:
            _, reply = self.sender.wait(rid, wait)
        except (ReplayTimeoutError, ResourceLimitError) as exc:
            self.requeue()
            raise type(exc)(
                f"{exc} [writer chunk {_steps(header)} was not stored; the writer "
                "keeps it and sends it again with its next flush()]"
            ) from exc
        except ReplayError as exc:
            self.in_flight.popleft()
            dropped = self._drop(header, arrays)
            raise type(exc)(
                f"{exc} [writer chunk {_steps(header)} was not stored and is "
                f"dropped, with {dropped} items; later steps continue as a new episode]"
            ) from exc
        self.in_flight.popleft()
        keys = reply["keys"]
        self.acknowledged += len(keys)
        if self.keys is not None:
            self.keys.append(np.array(keys))

    def requeue(self) -> None:
        """Put every unacknowledged chunk back in front of the queue, in order."""
        self.sender.forget([rid for rid, _, _ in self.in_flight])
        self.unsent.extendleft((None, h, a) for _, h, a in reversed(self.in_flight))
        self.in_flight.clear()

    def _drop(self, failed: dict, arrays: dict) -> int:
        """Forget a refused chunk: later ones start a new episode; items dropped."""
        dropped = len(arrays.get("item_anchor", ()))
        end = failed["first"] + failed["n"]
        self.requeue()
        queued = list(self.unsent)
        self.unsent.clear()
        seq, restart = failed["seq"], True
        for _, header, chunk_arrays in queued:
            header = dict(header, seq=seq)
            if restart:
                header["restart"] = True
                restart = False
            chunk_arrays, lost = _items_from(chunk_arrays, end)
            dropped += lost
            self.unsent.append((None, header, chunk_arrays))
            seq += 1
        self.seq = seq
        self.restart = self.restart or restart  # nothing queued: the next chunk restarts
        return dropped + self.on_drop(end)

    def close(self) -> None:
        """Tell the server to forget this writer's stream (best effort, no reply)."""
        if self.pid == os.getpid():
            self.sender.notify({"op": "close_writer", "writer": self.id})


def _send(sender: Sender, header: dict, arrays: dict, end: float | None) -> int:
    """Send a chunk, bounded by ``end``, after which no server starts it."""
    if end is None:
        return sender.send(header, arrays)
    return sender.send(header, arrays, until=end, expires=end)


def wait_time(timeout: float | None, end: float | None) -> float | None:
    """Seconds to wait for one acknowledgement (``None``: no limit)."""
    if end is not None:
        return max(0.0, end - time.monotonic())
    return None if timeout is None else timeout + REPLY_GRACE_S


def _steps(header: dict) -> str:
    """A chunk's stream steps, for messages."""
    first, n = header["first"], header["n"]
    return f"of steps [{first}, {first + n})" if n else "of items only (no new step)"


def _items_from(arrays: dict, first: int) -> tuple[dict, int]:
    """``arrays`` without items anchored before ``first``, and how many were removed."""
    anchors = arrays.get("item_anchor")
    if anchors is None:
        return arrays, 0
    keep = anchors >= first
    if keep.all():
        return arrays, 0
    out = {k: (v[keep] if k.startswith("item_") else v) for k, v in arrays.items()}
    return out, int((~keep).sum())


# Writers of this process not yet closed, held weakly (one dropped unclosed just warns).
EXIT_FLUSH_S = 10.0  # seconds the exit handler spends, over all writers still open
_OPEN: weakref.WeakSet = weakref.WeakSet()
_registered = threading.Lock()
_exit_handler: list = []


def register_open(writer: Any) -> None:
    """Flush ``writer`` at interpreter exit unless it is closed (or collected) first."""
    _OPEN.add(writer)
    with _registered:
        if not _exit_handler:
            _exit_handler.append(atexit.register(flush_open_writers))


def discard_open(writer: Any) -> None:
    """``writer`` was closed: nothing left to flush at exit."""
    _OPEN.discard(writer)


def flush_open_writers(budget_s: float = EXIT_FLUSH_S) -> int:
    """At exit, close this process's open writers within ``budget_s``; count stored."""
    end = time.monotonic() + budget_s
    stored = 0
    for writer in list(_OPEN):
        if not writer.open_here:
            continue
        left = end - time.monotonic()
        try:
            writer.close(timeout=max(0.001, left - REPLY_GRACE_S))
            stored += 1
        except Exception as exc:  # at exit: report, never raise
            log.warning("a remote writer left open could not flush at exit: %s", exc)
    return stored
