"""Same-host shared memory for sample replies: the client's side.

A learner on the server's host need not receive each batch through the socket. Its
:class:`~rlreplay.Client` keeps, per thread, a small ring of *reply slots*: each slot is a
shared-memory segment the client created and the server mapped
(:mod:`rlreplay.net.shm_segments`, :mod:`rlreplay.net.shm_server`). A sample request names
a free slot; the server gathers the batch straight into it and replies with the header
only (plus the small per-item arrays: keys, probabilities, ...). The returned
:class:`~rlreplay.Sample`'s data arrays are views on the slot. The server keeps every
semantic: it owns the tables, selectors, rate limiters and keys, exactly as for a socket
reply.

**Held batches are never overwritten.** A slot is leased to one request; it is free again
only when (a) that request's reply arrived or can no longer arrive from a server that
could write the slot, and (b) no array viewing the batch is left (a
``weakref.finalize`` on the array every view of the slot shares as its base: slicing,
``np.asarray`` or ``torch.from_numpy`` of any data array keeps the slot leased). When
every slot is leased, another is created (up to :data:`MAX_SLOTS` per thread) and past
that the batch comes through the socket: a sample never waits for a slot.

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

import threading
import weakref
from typing import Any

import numpy as np

from rlreplay.core.sample import Sample
from rlreplay.errors import InvalidArgumentError, ProtocolError, ReplayError, describe
from rlreplay.net import auth, wire
from rlreplay.net.channel import Channel
from rlreplay.net.payloads import as_sample
from rlreplay.net.shm_segments import Segment, available, boot_id

MAX_SLOTS = 8  # reply slots per thread (a learner's in-flight requests plus held batches)
SLOT_ROUNDING = 1 << 16  # slot sizes are multiples of this many bytes

_FREE, _REQUESTED, _HELD = 0, 1, 2


# id -> weak reference of each leased batch's base array (every view of the batch's data
# has it as its ``base``), while the batch lives
_ROOTS: dict[int, weakref.ref] = {}


def is_shared(array: Any) -> bool:
    """Whether ``array`` (a sampled data array, or any view of one) lies in a reply slot
    of this process: the batch came through shared memory."""
    if not isinstance(array, np.ndarray):
        return False
    for candidate in (array, array.base):
        ref = _ROOTS.get(id(candidate))
        if ref is not None and ref() is candidate:
            return True
    return False


class _Slot:
    """One reply slot: a segment the server mapped under ``token``."""

    __slots__ = ("lease", "rid", "segment", "state", "token")

    def __init__(self, segment: Segment, token: int):
        self.segment, self.token = segment, token
        self.state, self.rid, self.lease = _FREE, None, 0

    def release(self, lease: int, root_id: int) -> None:
        """The batch of ``lease`` is gone (a finalizer, in any thread)."""
        _ROOTS.pop(root_id, None)
        if self.lease == lease and self.state == _HELD:
            self.state = _FREE


class ReplySlots:
    """One thread's reply slots on one connection (its channel's socket).

    Args:
        transport: the client's transport (for ``shm_attach``/``shm_detach`` calls).
        channel: the thread's channel; the slots are valid for its current socket only.
    """

    def __init__(self, transport: Any, channel: Channel):
        self._transport, self._channel = transport, channel
        self._sock = channel.sock
        self.slots: list[_Slot] = []
        self.need: dict[tuple[str, int], int] = {}  # (table, batch size) -> bytes
        self._requests: dict[int, tuple[tuple[str, int], _Slot | None]] = {}

    def valid(self) -> bool:
        """Whether the slots still belong to the channel's socket (a reset opens a new
        connection, which the server knows nothing of)."""
        return self._channel.sock is self._sock

    # ------------------------------------------------------------- leases
    def lease(self, header: dict, until: Any) -> _Slot | None:
        """Name a slot in a sample request ``header`` (``"shm": token``); None, with
        ``"shm": 0`` (the server then tells how many bytes the batch needs), when this
        table and batch size were not seen yet or no slot can be had.

        Raises:
            InvalidArgumentError, ServerUnavailableError: from attaching a new slot
                (see :class:`SharedMemoryReplies`).
        """
        self._reclaim()
        if type(header.get("batch_size")) is not int:
            return None  # the server refuses it; nothing to size
        key = (header["table"], header["batch_size"])
        need = self.need.get(key)
        slot = None
        if need is not None:
            slot = self._free_slot(need)
            if slot is None:
                slot = self._new_slot(need, until)
        header["shm"] = 0 if slot is None else slot.token
        if slot is not None:
            slot.state, slot.rid = _REQUESTED, None
        return slot

    def sent(self, slot: _Slot | None, header: dict, rid: int) -> None:
        """The request with ``header`` went out as ``rid``."""
        if slot is not None:
            slot.rid = rid
        self._requests[rid] = ((header["table"], header["batch_size"]), slot)

    def unsent(self, slot: _Slot | None) -> None:
        """The request was never sent: its slot is free again."""
        if slot is not None and slot.rid is None:
            slot.state = _FREE

    def _reclaim(self) -> None:
        """Free slots whose request was answered (or failed) without a batch viewing
        them, and forget requests no reply can come for any more."""
        ch = self._channel
        for rid in [r for r in self._requests if _settled(ch, r)]:
            _, slot = self._requests.pop(rid)
            if slot is not None and slot.state == _REQUESTED and slot.rid == rid:
                slot.state = _FREE

    def _free_slot(self, need: int) -> _Slot | None:
        fits = [s for s in self.slots if s.state == _FREE and s.segment.nbytes >= need]
        return min(fits, key=lambda s: s.segment.nbytes) if fits else None

    def _new_slot(self, need: int, until: Any) -> _Slot | None:
        """Attach another slot of at least ``need`` bytes (replacing a free slot too
        small for it when the ring is full); None when every slot is leased."""
        if len(self.slots) >= MAX_SLOTS:
            small = [s for s in self.slots if s.state == _FREE]
            if not small:
                return None
            self.detach(small[:1])
        nbytes = -(-need // SLOT_ROUNDING) * SLOT_ROUNDING
        segment = Segment.create(nbytes)
        try:
            header = {
                "op": "shm_attach",
                "name": segment.name,
                "nbytes": nbytes,
                "nonce": segment.nonce,
                "boot_id": boot_id(),
            }
            token = self._transport.call(header, until=until)[0]["token"]
        finally:
            segment.unlink()
        if type(token) is not int or token < 1:
            raise ProtocolError(f"shm_attach answered token {describe(token)}")
        slot = _Slot(segment, token)
        self.slots.append(slot)
        return slot

    def detach(self, slots: list[_Slot]) -> None:
        """Drop ``slots`` here and at the server (batches viewing them stay valid)."""
        for slot in slots:
            self.slots.remove(slot)
        if slots and self.valid():
            header = {"op": "shm_detach", "tokens": [s.token for s in slots], "noreply": True}
            self._transport.send(header)

    # ------------------------------------------------------------- replies
    def sample(self, header: dict, arrays: dict) -> Sample:
        """The :class:`Sample` of a reply; its data arrays view the slot the reply names."""
        rid = header.get("id")
        key, slot = self._requests.pop(rid, (None, None))
        need = header.get("shm_need")
        if key is not None and type(need) is int and need > 0:
            self.need[key] = need
        entries = header.get("shm")
        if header.get("shm_lost"):
            self.lost()
        if entries is None or slot is None:
            if slot is not None and slot.state == _REQUESTED:
                slot.state = _FREE
            if entries is not None:
                raise ProtocolError("a reply names a shared-memory slot its request did not")
            return as_sample(header, arrays)
        try:
            checked = _entries(entries, slot.segment.nbytes)
        except ProtocolError:
            slot.state = _FREE
            raise
        root = slot.segment.view()  # a new base for this batch's views
        for name, dtype, shape, off, nbytes in checked:
            arrays["data/" + name] = root[off : off + nbytes].view(dtype).reshape(shape)
        slot.lease += 1
        slot.state = _HELD
        _ROOTS[id(root)] = weakref.ref(root)
        weakref.finalize(root, slot.release, slot.lease, id(root))
        return as_sample(header, arrays)

    def lost(self) -> None:
        """The server forgot this connection's slots (idle, or restarted): drop them all;
        new ones are attached on demand."""
        self.slots = []


def _settled(ch: Channel, rid: int) -> bool:
    """Whether no reply to ``rid`` is on its way or waiting to be read."""
    return rid not in ch.pending and rid not in ch.abandoned and rid not in ch.replies


def _entries(entries: Any, nbytes: int) -> list[tuple]:
    """Checked ``[name, dtype, shape, offset]`` entries of a reply, with byte counts.

    Raises:
        ProtocolError: for an entry that is malformed or does not fit the slot.
    """
    out = []
    if not isinstance(entries, list):
        raise ProtocolError(f"reply field 'shm' is {describe(entries)}, not a list")
    for entry in entries:
        try:
            name, dtype_str, shape, off = entry
            dtype = wire._dtype(dtype_str)
            shape = tuple(shape)
            if not isinstance(name, str) or dtype is None or type(off) is not int:
                raise ValueError(entry)
            if not all(type(d) is int and 0 <= d <= wire.MAX_DIM for d in shape):
                raise ValueError(entry)
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if off < 0 or off + size > nbytes or off % dtype.alignment:
                raise ValueError(entry)
        except (TypeError, ValueError):
            raise ProtocolError(f"malformed shared-memory entry {describe(entry)}") from None
        out.append((name, dtype, shape, off, size))
    return out


class SharedMemoryReplies:
    """A client's choice of reply path for samples, and its threads' reply slots.

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

    def slots(self, ch: Channel) -> ReplySlots | None:
        """The reply slots of the thread whose channel is ``ch`` (None: not used)."""
        if not self.enabled:
            return None
        slots = ch.shm
        if slots is None or not slots.valid():
            slots = ch.shm = ReplySlots(self._transport, ch)
        return slots

    def send(self, header: dict, arrays: dict, **send_kw: Any) -> int:
        """Send a sample request, naming a reply slot when one can be had; its id."""
        tr = self._transport
        ch = tr.channel()
        slots = self.slots(ch)
        if slots is None:
            return tr.send(header, arrays, **send_kw)
        slot = self._lease(slots, header, send_kw.get("until"))
        try:
            rid = tr.send(header, arrays, **send_kw)
        except BaseException:
            slots.unsent(slot)
            raise
        slots.sent(slot, header, rid)
        return rid

    def _lease(self, slots: ReplySlots, header: dict, until: Any) -> _Slot | None:
        try:
            return slots.lease(header, until)
        except (ReplayError, OSError) as exc:
            if isinstance(exc, wire.errors.ServerUnavailableError):
                raise
            if isinstance(exc, wire.errors.ResourceLimitError):
                header["shm"] = 0
                return None
            with self._lock:
                self.failure = f"{type(exc).__name__}: {exc}"
                if self.mode is True:
                    raise InvalidArgumentError(
                        f"shared_memory=True, but samples cannot come through shared "
                        f"memory: {self.failure}; use shared_memory=None to fall back to "
                        "the socket"
                    ) from None
                self.enabled = False
            header.pop("shm", None)
            return None

    def sample(self, reply: tuple[dict, dict]) -> Sample:
        """The :class:`Sample` of a sample reply (views on a slot, or socket arrays)."""
        header, arrays = reply
        ch = self._transport.channel()
        slots = ch.shm
        if slots is None or not slots.valid():
            if header.get("shm") is not None:
                raise ProtocolError("a reply names a shared-memory slot this thread has not")
            return as_sample(header, arrays)
        return slots.sample(header, arrays)
