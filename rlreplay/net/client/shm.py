"""Same-host shared memory for sample replies and for inserted rows: the client's side.

Invariant: a slot is never reused while its request may be served or a view of its batch is
alive; with no free slot, arrays take the socket (no call waits). See docs/shared_memory.md.
"""

from __future__ import annotations

import errno
import threading
import time
from typing import Any

from rlreplay.core.sample import Sample
from rlreplay.errors import (
    InvalidArgumentError,
    ProtocolError,
    ReplayError,
    ResourceLimitError,
    ServerUnavailableError,
    describe,
)
from rlreplay.net.client.channel import Channel
from rlreplay.net.client.shm_ring import (
    MAX_SLOTS,
    MIN_BYTES,
    SlotRing,
    _Slot,
    budget_bytes,
    is_shared,
)
from rlreplay.net.wire import auth
from rlreplay.net.wire.payloads import as_sample
from rlreplay.net.wire.shm_segments import aligned, available

__all__ = ["MAX_SLOTS", "MIN_BYTES", "SharedMemoryPath", "SlotRing", "is_shared", "budget_bytes"]

# After /dev/shm had no room for a slot, a thread uses the socket this long before retrying.
NO_ROOM_RETRY_S = 1.0
_NO_ROOM = (errno.ENOSPC, errno.ENOMEM)


class SharedMemoryPath:
    """A client's choice of path for large arrays, and its threads' slot rings.

    Args:
        address: the client's server address.
        mode: ``None`` (automatic), ``False`` (never) or ``True`` (required).
        transport: the client's transport.

    Raises:
        InvalidArgumentError: for a mode that is not None or a bool, ``True`` without
            ``/dev/shm``, or a malformed ``RLREPLAY_SHM_BUDGET_BYTES``.
    """

    def __init__(self, address: str, mode: bool | None, transport: Any):
        if mode is not None and not isinstance(mode, bool):
            raise InvalidArgumentError(
                f"shared_memory={describe(mode)} must be None (automatic), True or False"
            )
        if mode is True and not available():
            raise InvalidArgumentError(
                "shared_memory=True, but this platform has no writable /dev/shm; use "
                "shared_memory=None to fall back to the socket"
            )
        self.mode = mode
        self.enabled = mode is True or (mode is None and auth.is_loopback(address) and available())
        if self.enabled:
            budget_bytes()  # a malformed RLREPLAY_SHM_BUDGET_BYTES fails here, not in a call
        self._transport = transport
        self._lock = threading.Lock()
        self.failure: str | None = None  # why the server could not map a segment

    def ring(self, ch: Channel) -> SlotRing | None:
        """The slots of the thread whose channel is ``ch`` (None: not used)."""
        if not self.enabled:
            return None
        ring = ch.shm
        if ring is None:
            ring = ch.shm = SlotRing(self._transport, ch)
        elif not ring.usable(time.monotonic()):
            ring.detach(list(ring.slots))
            ring = ch.shm = ring.renewed()
        return ring

    def _lease(self, ring: SlotRing, need: int, until: Any) -> _Slot | None:
        """``ring.lease``, or None (the socket) where attaching fails: this time for a
        server at its limit or a full ``/dev/shm``, for good if the server cannot map this
        client's segments (an error with ``shared_memory=True``)."""
        try:
            return ring.lease(need, until)
        except (ReplayError, OSError) as exc:
            if isinstance(exc, ServerUnavailableError):
                raise
            if isinstance(exc, ResourceLimitError):
                return None
            if isinstance(exc, OSError) and exc.errno in _NO_ROOM:
                # /dev/shm full for now: the socket this time only
                ring.no_room_until = time.monotonic() + NO_ROOM_RETRY_S
                self.failure = f"{type(exc).__name__}: {exc}"
                return None
            with self._lock:
                self.failure = f"{type(exc).__name__}: {exc}"
                if self.mode is True:
                    raise InvalidArgumentError(
                        f"shared_memory=True, but arrays cannot travel through shared "
                        f"memory: {self.failure}; use shared_memory=None to fall back to "
                        "the socket"
                    ) from None
                self.enabled = False
            return None

    def send_sample(self, header: dict, arrays: dict, **send_kw: Any) -> int:
        """Send a sample request naming a slot for its data when one can be had; its id."""
        tr = self._transport
        ring = self.ring(tr.channel())
        if ring is None:
            return tr.send(header, arrays, **send_kw)
        batch = header.get("batch_size")
        key = (header["table"], batch) if type(batch) is int else None
        need = ring.need.get(key) if key is not None else None
        if need is not None and need < MIN_BYTES:
            return tr.send(header, arrays, **send_kw)  # a small batch: the socket
        slot = None if need is None else self._lease(ring, need, send_kw.get("until"))
        if self.enabled:
            header["shm"] = 0 if slot is None else slot.token
        try:
            rid = tr.send(header, arrays, **send_kw)
        except BaseException:
            ring.unsent(slot)
            raise
        ring.sent(slot, key, rid)
        return rid

    def sample(self, reply: tuple[dict, dict]) -> Sample:
        """The :class:`Sample` of a sample reply (views on a slot, or socket arrays)."""
        header, arrays = reply
        ring = self._transport.channel().shm
        if ring is None:
            if header.get("shm") is not None:
                raise ProtocolError("a reply names a shared-memory slot this thread has not")
            return as_sample(header, arrays)
        return ring.sample(header, arrays)

    def place(
        self, ch: Channel, header: dict, arrays: dict, until: Any
    ) -> tuple[dict, _Slot | None]:
        """Move large insert/chunk arrays into a slot; returns the arrays left and the slot."""
        # a request sent again (a writer's chunk after a lost reply) names its new slot
        header.pop("shm_in", None)
        ring = self.ring(ch)
        if ring is None:
            return arrays, None
        large = [
            (n, a)
            for n, a in arrays.items()
            if a.nbytes >= MIN_BYTES and n.startswith("data/")
        ]
        if not large:
            return arrays, None
        total = sum(a.nbytes for a in arrays.values())
        if ch.max_message_bytes is not None and total > ch.max_message_bytes:
            return arrays, None
        slot = self._lease(ring, sum(aligned(a.nbytes) for _, a in large), until)
        if slot is None:
            return arrays, None
        ring.place(slot, header, large)
        placed = {n for n, _ in large}
        return {n: a for n, a in arrays.items() if n not in placed}, slot

    def sent(self, ch: Channel, slot: _Slot, rid: int) -> None:
        """The request that :meth:`place` filled ``slot`` for went out as ``rid``."""
        ring = ch.shm
        if ring is not None:
            ring.sent(slot, None, rid)
