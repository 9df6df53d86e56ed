"""A thread's ring of shared-memory slots on one connection: leases, attach and detach,
batch views, and the process's byte budget (client side of :mod:`rlreplay.net.client.shm`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from typing import Any

import numpy as np
import zmq

from rlreplay.core.sample import Sample
from rlreplay.errors import InvalidArgumentError, ProtocolError, describe
from rlreplay.net.client.channel import Channel
from rlreplay.net.wire import codec, framing
from rlreplay.net.wire.payloads import as_sample
from rlreplay.net.wire.shm_segments import IDLE_S, Segment, aligned, boot_id, check_entries

MAX_SLOTS = 8  # slots per thread (a learner's in-flight requests plus held batches)
# Smaller batches and arrays go through the socket: a slot's bookkeeping costs more.
MIN_BYTES = codec.ZERO_COPY_BYTES
SLOT_ROUNDING = 1 << 16  # slot sizes are multiples of this many bytes
# Slots unused this long are attached afresh: the server forgets them after IDLE_S.
RENEW_S = IDLE_S / 2

# The process's slots hold at most this many bytes of /dev/shm (or a quarter of its free
# space, if less); past it, the socket. BUDGET_VARIABLE overrides it (0: no limit).
DEFAULT_BUDGET_BYTES = 256 << 20
BUDGET_VARIABLE = "RLREPLAY_SHM_BUDGET_BYTES"

_FREE, _REQUESTED, _HELD, _RETIRED = 0, 1, 2, 3


class _Budget:
    """Bytes of ``/dev/shm`` this process's slots hold, against a limit set at first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.limit: int | None = None  # decided at first use (see budget_bytes)
        self.used = 0

    def reserve(self, nbytes: int) -> bool:
        """Count ``nbytes`` more if they fit the limit; whether they did."""
        limit = budget_bytes()
        with self._lock:
            if self.used + nbytes > limit:
                return False
            self.used += nbytes
            return True

    def free(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


BUDGET = _Budget()


def budget_bytes() -> int:
    """The process's byte budget for slots: ``RLREPLAY_SHM_BUDGET_BYTES`` if set, else the
    smaller of :data:`DEFAULT_BUDGET_BYTES` and a quarter of ``/dev/shm``'s free space.

    Raises:
        InvalidArgumentError: if ``RLREPLAY_SHM_BUDGET_BYTES`` is not an int >= 0.
    """
    if BUDGET.limit is not None:
        return BUDGET.limit
    text = os.environ.get(BUDGET_VARIABLE)
    if text is not None:
        try:
            limit = int(text)
        except ValueError:
            limit = -1
        if limit < 0:
            raise InvalidArgumentError(
                f"{BUDGET_VARIABLE}={text!r} must be a whole number of bytes >= 0 (0: no "
                "limit); unset it for the default"
            )
        limit = limit or (1 << 62)
    else:
        try:
            st = os.statvfs("/dev/shm")
            limit = min(DEFAULT_BUDGET_BYTES, st.f_bavail * st.f_frsize // 4)
        except OSError:
            limit = DEFAULT_BUDGET_BYTES
    BUDGET.limit = limit
    return limit

# Times this process forked: a slot holding a batch at a fork is shared with the child, so
# it is never leased again.
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_parent=_count_fork)

# id -> weak reference of each leased batch's base array, while the batch lives
_ROOTS: dict[int, weakref.ref] = {}


def is_shared(array: Any) -> bool:
    """Whether ``array`` (or a view of it) lies in a slot of this process."""
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
    """One thread's slots on one connection (used by that thread only, but for the
    finalizers that free slots of dropped batches).

    Args:
        transport: the client's transport (for ``shm_attach``/``shm_detach``).
        channel: the thread's channel; the slots are valid for its current socket only.
        need, requests: what a ring this one renews knew (see :meth:`renewed`).
    """

    def __init__(
        self,
        transport: Any,
        channel: Channel,
        need: dict[tuple[str, int], int] | None = None,
        requests: dict[int, tuple[tuple[str, int] | None, _Slot | None]] | None = None,
    ):
        self._transport, self._channel = transport, channel
        self._sock = channel.sock
        self.slots: list[_Slot] = []
        # (table, batch size) -> bytes
        self.need: dict[tuple[str, int], int] = {} if need is None else need
        self._requests = {} if requests is None else requests
        self.last_used = time.monotonic()
        self._epoch: int | None = None  # of the server that attached the slots
        self.no_room_until = -float("inf")  # no new slot before then (/dev/shm was full)

    def usable(self, now: float) -> bool:
        """Whether the slots still belong to the channel's socket and server, recently used."""
        ch = self._channel
        return (
            ch.sock is self._sock
            and (self._epoch is None or ch.epoch == self._epoch)
            and now - self.last_used < RENEW_S
        )

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
        """The request that leased ``slot`` (a sample of ``key``, or None) went out as ``rid``."""
        if slot is not None:
            slot.rid = rid
        if slot is not None or key is not None:
            self._requests[rid] = (key, slot)

    def unsent(self, slot: _Slot | None) -> None:
        """The request that leased ``slot`` was never sent: the slot is free again."""
        if slot is not None and slot.state == _REQUESTED and slot.rid is None:
            slot.state = _FREE

    def _reclaim(self) -> None:
        """Free the slots no reply will come for, and drop those retired."""
        ch = self._channel
        for rid in [r for r in self._requests if _settled(ch, r)]:
            _, slot = self._requests.pop(rid)
            if slot is not None and slot.state == _REQUESTED and slot.rid == rid:
                slot.state = _FREE
        retired = [s for s in self.slots if s.state == _RETIRED]
        if retired:
            self.detach(retired)

    def renewed(self) -> SlotRing:
        """A ring for the channel's new socket, keeping batch sizes and requests still out."""
        return SlotRing(self._transport, self._channel, self.need, self._requests)

    def _attach(self, need: int, until: Any) -> _Slot | None:
        """Attach another slot of ``need`` bytes or more; None if none may be had now."""
        if len(self.slots) >= MAX_SLOTS:
            free = [s for s in self.slots if s.state == _FREE]
            if not free:
                return None
        if time.monotonic() < self.no_room_until:
            return None
        if len(self.slots) >= MAX_SLOTS:
            self.detach(free[:1])
        nbytes = -(-need // SLOT_ROUNDING) * SLOT_ROUNDING
        if not BUDGET.reserve(nbytes):
            return None  # the process's slots hold their budget: the socket
        try:
            segment = Segment.create(nbytes)
        except BaseException:
            BUDGET.free(nbytes)
            raise
        weakref.finalize(segment, BUDGET.free, nbytes).atexit = False
        tr = self._transport
        try:
            header = {
                "op": "shm_attach",
                "name": segment.name,
                "nbytes": nbytes,
                "nonce": segment.nonce,
                "boot_id": boot_id(),
            }
            rid = tr.send(header, until=until, expires=until)
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
            self._transport.send({"op": "shm_detach", "tokens": tokens, "noreply": True})

    def release(self) -> None:
        """Drop every slot, telling the server without waiting; never raises."""
        slots, self.slots = self.slots, []
        ch = self._channel
        if not slots or ch.sock is not self._sock or ch.epoch != self._epoch:
            return
        header: dict[str, Any] = {
            "op": "shm_detach",
            "tokens": [s.token for s in slots],
            "noreply": True,
            "id": self._transport.next_id(),
        }
        if ch.epoch is not None:
            header["epoch"] = ch.epoch
        with contextlib.suppress(zmq.ZMQError):
            framing.send(ch.sock, codec.encode(header, None))

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
