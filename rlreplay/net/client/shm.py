"""Same-host shared memory for sample replies and for inserted rows: the client's side.

A learner or an actor on the server's host need not pass its large arrays through the
socket. Its :class:`~rlreplay.Client` keeps, per thread, a small ring of *slots*: each slot
is a shared-memory segment the client created and the server mapped
(:mod:`rlreplay.net.wire.shm_segments`, :mod:`rlreplay.net.server.shm`). The server keeps every
semantic: it owns the tables, selectors, rate limiters and keys, exactly as for the socket.

- **Samples**: a sample request names a free slot; the server gathers the batch straight
  into it and replies with the header only (plus the small per-item arrays: keys,
  probabilities, ...). The :class:`~rlreplay.Sample`'s data arrays are views on the slot.
  The first reply for a table and batch size says how many bytes the batch needs;
  batches under :data:`MIN_BYTES` keep going through the socket.
- **Inserts and writer chunks**: their large arrays (at least :data:`MIN_BYTES`) are
  copied into a free slot and the request names the slot instead of carrying them;
  the server reads them from there (it copies them into the table's store, as it does
  from a socket frame) before it answers.

**Nothing is overwritten under its reader.** A slot is leased to one request and is free
again only once (a) that request's reply arrived, or no reply can arrive any more from a
server that could still read or write the slot, and (b) for a sample, no array viewing the
batch is left (a ``weakref.finalize`` on the array every view of the batch shares as its
base: slicing, ``np.asarray`` or ``torch.from_numpy`` of any data array keeps the slot
leased). When every slot is leased another is attached (up to :data:`MAX_SLOTS` per
thread), and past that the arrays go through the socket: no call waits for a slot.

**Slots are released when no longer wanted**: a closed client's and an ended thread's at
once (a ``shm_detach`` nobody waits for), and the process's slots together never take more
of ``/dev/shm`` than its budget (:func:`~rlreplay.net.client.shm_ring.budget_bytes`): past it, the
socket.

**No crash leaks a segment.** The server unlinks a segment as soon as it mapped it, and
the client once the server answered; from then on the memory belongs to the two mappings
and the kernel frees it when the last goes, whichever process is killed. See
:mod:`rlreplay.net.wire.shm_segments` for the one window before that and how it is swept.

When it is used (``Client(shared_memory=...)``): ``None`` (default) uses it for ``ipc://``
addresses and loopback TCP when this platform has ``/dev/shm``, and falls back to the
socket for good, silently, if the server cannot map the client's segments (another host,
another user, a server without the operation); ``False`` never uses it; ``True`` requires
it and raises :class:`~rlreplay.errors.InvalidArgumentError` when it cannot be used.
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

# After /dev/shm had no room for a slot (a container's 64 MiB, say), a thread's requests
# take the socket for this many seconds before it tries to reserve a slot again.
NO_ROOM_RETRY_S = 1.0
_NO_ROOM = (errno.ENOSPC, errno.ENOMEM)


class SharedMemoryPath:
    """A client's choice of path for large arrays, and its threads' slot rings.

    Args:
        address: the client's server address.
        mode: ``None`` (automatic), ``False`` (never) or ``True`` (required).
        transport: the client's transport.

    Raises:
        InvalidArgumentError: for a mode that is not None or a bool, or ``True`` where
            this process cannot create segments (no ``/dev/shm``), or a malformed
            ``RLREPLAY_SHM_BUDGET_BYTES`` (see :func:`~rlreplay.net.client.shm_ring.budget_bytes`).
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
        """``ring.lease``, with what attaching may raise turned into this client's policy:
        None (the socket) for a server at its limit or a full ``/dev/shm`` (this time),
        and for a server that cannot map this client's segments (from now on; an error
        with ``shared_memory=True``)."""
        try:
            return ring.lease(need, until)
        except (ReplayError, OSError) as exc:
            if isinstance(exc, ServerUnavailableError):
                raise
            if isinstance(exc, ResourceLimitError):
                return None
            if isinstance(exc, OSError) and exc.errno in _NO_ROOM:
                # /dev/shm full for now: the socket this time, not from now on (a
                # thread's slots or another program may free their room)
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

    # ------------------------------------------------------------- samples
    def send_sample(self, header: dict, arrays: dict, **send_kw: Any) -> int:
        """Send a sample request, naming a slot for its data when one can be had (with
        ``"shm": 0`` when the batch's size is not known yet: the reply says it); its id."""
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

    # ------------------------------------------------------------- requests
    def place(
        self, ch: Channel, header: dict, arrays: dict, until: Any
    ) -> tuple[dict, _Slot | None]:
        """Move the large arrays of an insert or writer request into a slot (the request
        then names it in ``"shm_in"``); returns the arrays left for the socket and the
        slot (for :meth:`sent`). Arrays stay for the socket when no slot can be had, or
        when the request is larger than the server accepts (the socket's check says so).
        """
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
