"""Same-host shared memory for sample replies and for inserted rows: the client's side.

A learner or an actor on the server's host need not pass its large arrays through the
socket. Its :class:`~rlreplay.Client` keeps, per thread, a small ring of *slots*: each slot
is a shared-memory segment the client created and the server mapped
(:mod:`rlreplay.net.shm_segments`, :mod:`rlreplay.net.shm_server`). The server keeps every
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

**No crash leaks a segment.** The server unlinks a segment as soon as it mapped it, and
the client once the server answered; from then on the memory belongs to the two mappings
and the kernel frees it when the last goes, whichever process is killed. See
:mod:`rlreplay.net.shm_segments` for the one window before that and how it is swept.

When it is used (``Client(shared_memory=...)``): ``None`` (default) uses it for ``ipc://``
addresses and loopback TCP when this platform has ``/dev/shm``, and falls back to the
socket for good, silently, if the server cannot map the client's segments (another host,
another user, a server without the operation); ``False`` never uses it; ``True`` requires
it and raises :class:`~rlreplay.errors.InvalidArgumentError` when it cannot be used.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from typing import Any

import numpy as np

from rlreplay.core.sample import Sample
from rlreplay.errors import (
    InvalidArgumentError,
    ProtocolError,
    ReplayError,
    ResourceLimitError,
    ServerUnavailableError,
    describe,
)
from rlreplay.net import auth, wire
from rlreplay.net.channel import Channel
from rlreplay.net.payloads import as_sample
from rlreplay.net.shm_segments import Segment, aligned, available, boot_id, check_entries
from rlreplay.net.shm_server import IDLE_S

MAX_SLOTS = 8  # slots per thread (a learner's in-flight requests plus held batches)
# Batches (and arrays of inserts) smaller than this go through the socket: there the
# bookkeeping of a slot costs more than the copies it saves.
MIN_BYTES = wire.ZERO_COPY_BYTES
SLOT_ROUNDING = 1 << 16  # slot sizes are multiples of this many bytes
# A thread's slots unused for this long are dropped and attached afresh: the server
# forgets them after IDLE_S, and a request must never name a slot it forgot.
RENEW_S = IDLE_S / 2
# After /dev/shm had no room for a slot (a container's 64 MiB, say), a thread's requests
# take the socket for this many seconds before it tries to reserve a slot again.
NO_ROOM_RETRY_S = 1.0
_NO_ROOM = (errno.ENOSPC, errno.ENOMEM)

_FREE, _REQUESTED, _HELD, _RETIRED = 0, 1, 2, 3

# Times this process forked. A slot's memory is shared with a forked child, not copied
# on write: a batch held at a fork is the child's too, so its slot is never leased again
# (it is retired when the parent's batch goes), or the parent's next batch would change
# the child's.
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_parent=_count_fork)

# id -> weak reference of each leased batch's base array (every view of the batch's data
# has it as its ``base``), while the batch lives
_ROOTS: dict[int, weakref.ref] = {}


def is_shared(array: Any) -> bool:
    """Whether ``array`` (a sampled data array, or any view of one) lies in a slot of
    this process: the batch came through shared memory."""
    if not isinstance(array, np.ndarray):
        return False
    for candidate in (array, array.base):
        ref = _ROOTS.get(id(candidate))
        if ref is not None and ref() is candidate:
            return True
    return False


class _Slot:
    """One slot: a segment the server mapped under ``token``."""

    __slots__ = ("forks", "lease", "rid", "segment", "state", "token")

    def __init__(self, segment: Segment, token: int):
        self.segment, self.token = segment, token
        self.state, self.rid, self.lease, self.forks = _FREE, None, 0, 0

    def release(self, lease: int, root_id: int) -> None:
        """The batch of ``lease`` is gone (a finalizer, in any thread)."""
        _ROOTS.pop(root_id, None)
        if self.lease == lease and self.state == _HELD:
            # held across a fork: the child may still read the batch
            self.state = _FREE if self.forks == _forks else _RETIRED


class SlotRing:
    """One thread's slots on one connection (its channel's socket): used by that thread
    only, but for the finalizers that free slots of dropped batches.

    Args:
        transport: the client's transport (for ``shm_attach``/``shm_detach``).
        channel: the thread's channel; the slots are valid for its current socket only.
    """

    def __init__(self, transport: Any, channel: Channel):
        self._transport, self._channel = transport, channel
        self._sock = channel.sock
        self.slots: list[_Slot] = []
        self.need: dict[tuple[str, int], int] = {}  # (table, batch size) -> bytes
        self._requests: dict[int, tuple[tuple[str, int] | None, _Slot | None]] = {}
        self.last_used = time.monotonic()
        self._epoch: int | None = None  # of the server that attached the slots
        self.no_room_until = -float("inf")  # no new slot before then (/dev/shm was full)

    def usable(self, now: float) -> bool:
        """Whether the slots still belong to the channel's socket (a reset opens a new
        connection, which the server knows nothing of), to the server that attached them
        (not one restarted since), and were used recently enough that it still maps them."""
        ch = self._channel
        return (
            ch.sock is self._sock
            and (self._epoch is None or ch.epoch == self._epoch)
            and now - self.last_used < RENEW_S
        )

    # ------------------------------------------------------------- leases
    def lease(self, need: int, until: Any) -> _Slot | None:
        """A free slot of at least ``need`` bytes, leased (attaching one if needed);
        None when every slot is leased.

        Raises:
            ReplayError, OSError: from attaching a new slot (the caller decides).
        """
        self.last_used = time.monotonic()
        self._reclaim()
        fits = [s for s in self.slots if s.state == _FREE and s.segment.nbytes >= need]
        slot = min(fits, key=lambda s: s.segment.nbytes) if fits else self._attach(need, until)
        if slot is not None:
            slot.state, slot.rid = _REQUESTED, None
        return slot

    def sent(self, slot: _Slot | None, key: tuple[str, int] | None, rid: int) -> None:
        """The request that leased ``slot`` (a sample of ``key``, or None) went out as
        ``rid``."""
        if slot is not None:
            slot.rid = rid
        if slot is not None or key is not None:
            self._requests[rid] = (key, slot)

    def unsent(self, slot: _Slot | None) -> None:
        """The request that leased ``slot`` was never sent: the slot is free again."""
        if slot is not None and slot.state == _REQUESTED and slot.rid is None:
            slot.state = _FREE

    def _reclaim(self) -> None:
        """Free the slots of requests no reply will come for (nor be read from the slot),
        and drop those retired (a forked child may still read their batch)."""
        ch = self._channel
        for rid in [r for r in self._requests if _settled(ch, r)]:
            _, slot = self._requests.pop(rid)
            if slot is not None and slot.state == _REQUESTED and slot.rid == rid:
                slot.state = _FREE
        retired = [s for s in self.slots if s.state == _RETIRED]
        if retired:
            self.detach(retired)

    def renewed(self) -> SlotRing:
        """A ring for the channel's current socket that goes on with this one's
        knowledge: batch sizes, and the requests still out (their replies may name
        slots of this ring, which stay mapped here but are never leased again)."""
        ring = SlotRing(self._transport, self._channel)
        ring.need, ring._requests = self.need, self._requests
        return ring

    def _attach(self, need: int, until: Any) -> _Slot | None:
        """Attach another slot of at least ``need`` bytes (replacing a free slot too
        small for it when the ring is full); None when every slot is leased, or while
        ``/dev/shm`` had no room for one a moment ago (``no_room_until``)."""
        if len(self.slots) >= MAX_SLOTS:
            free = [s for s in self.slots if s.state == _FREE]
            if not free:
                return None
        if time.monotonic() < self.no_room_until:
            return None
        if len(self.slots) >= MAX_SLOTS:
            self.detach(free[:1])
        nbytes = -(-need // SLOT_ROUNDING) * SLOT_ROUNDING
        segment = Segment.create(nbytes)
        tr = self._transport
        try:
            header = {
                "op": "shm_attach",
                "name": segment.name,
                "nbytes": nbytes,
                "nonce": segment.nonce,
                "boot_id": boot_id(),
            }
            rid = tr.send(header, until=until, expires=until, hooked=False)
            token = tr.wait_until(rid, until)[0]["token"]
        finally:
            segment.unlink()
        if type(token) is not int or token < 1:
            raise ProtocolError(f"shm_attach answered token {describe(token)}")
        if self._epoch is not None and self._channel.epoch != self._epoch:
            self.slots = []  # the server restarted: the others are not its own
        self._epoch = self._channel.epoch
        slot = _Slot(segment, token)
        self.slots.append(slot)
        return slot

    def detach(self, slots: list[_Slot]) -> None:
        """Drop ``slots`` here and at the server (batches viewing them stay valid)."""
        for slot in slots:
            self.slots.remove(slot)
        if slots and self._channel.sock is self._sock and self._channel.epoch == self._epoch:
            tokens = [s.token for s in slots]
            self._transport.send({"op": "shm_detach", "tokens": tokens, "noreply": True},
                                 hooked=False)

    # ------------------------------------------------------------- samples
    def sample(self, header: dict, arrays: dict) -> Sample:
        """The :class:`Sample` of a reply; its data arrays view the slot the reply names."""
        key, slot = self._requests.pop(header.get("id"), (None, None))
        need = header.get("shm_need")
        if key is not None and type(need) is int and need > 0:
            self.need[key] = need
        entries = header.get("shm")
        if header.get("shm_lost"):
            self.slots = []  # the server forgot them: attach new ones on demand
        if entries is None or slot is None:
            if slot is not None and slot.state == _REQUESTED:
                slot.state = _FREE
            if entries is not None:
                raise ProtocolError("a reply names a shared-memory slot its request did not")
            return as_sample(header, arrays)
        try:
            checked = check_entries(entries, slot.segment.nbytes)
        except ProtocolError:
            slot.state = _FREE
            raise
        root = slot.segment.view()  # a new base for this batch's views
        for name, dtype, shape, off, nbytes in checked:
            arrays["data/" + name] = root[off : off + nbytes].view(dtype).reshape(shape)
        slot.lease += 1
        slot.state, slot.forks = _HELD, _forks
        _ROOTS[id(root)] = weakref.ref(root)
        weakref.finalize(root, slot.release, slot.lease, id(root))
        return as_sample(header, arrays)

    # ------------------------------------------------------------- requests
    def place(self, slot: _Slot, header: dict, large: list[tuple[str, np.ndarray]]) -> None:
        """Copy ``large`` arrays into ``slot`` and name them in ``header["shm_in"]``."""
        data, entries, off = slot.segment.data, [], 0
        for name, a in large:
            a = np.ascontiguousarray(a)
            dest = data[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
            np.copyto(dest, a, casting="no")
            entries.append([name, a.dtype.str, list(a.shape), off])
            off = aligned(off + a.nbytes)
        header["shm_in"] = [slot.token, entries]


def _settled(ch: Channel, rid: int) -> bool:
    """Whether no reply to ``rid`` is on its way or waiting to be read."""
    return rid not in ch.pending and rid not in ch.abandoned and rid not in ch.replies


class SharedMemoryPath:
    """A client's choice of path for large arrays, and its threads' slot rings.

    Args:
        address: the client's server address.
        mode: ``None`` (automatic), ``False`` (never) or ``True`` (required).
        transport: the client's transport.

    Raises:
        InvalidArgumentError: for a mode that is not None or a bool, or ``True`` where
            this process cannot create segments (no ``/dev/shm``).
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
