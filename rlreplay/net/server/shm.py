"""The server's side of shared memory: clients' segments, and batches gathered into them.

A segment belongs to the connection that attached it and is dropped when detached or unused
for :data:`IDLE_S` seconds; an unknown token is answered through the socket with
``"shm_lost": true``. See docs/shared_memory.md.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from rlreplay.errors import InvalidArgumentError, ProtocolError, ResourceLimitError, describe
from rlreplay.net.wire import codec
from rlreplay.net.wire.shm_segments import (
    IDLE_S,
    MAX_SEGMENT_BYTES,
    NONCE_BYTES,
    Segment,
    aligned,
    boot_id,
    check_entries,
)

PLACED_OPS = ("insert", "write")  # requests whose step data may come in shared memory
MAX_SEGMENTS_PER_CLIENT = 64


class SlotTarget:
    """Where one sample's data arrays go (the ``buffers`` of :meth:`Table.sample`).

    Args:
        segment: the attached segment, or None (token unknown, or 0: size query only).
        lost: the token was not 0 but is unknown to this connection.
    """

    def __init__(self, segment: Segment | None, lost: bool = False):
        self.segment, self.lost = segment, lost
        self._used = 0
        self._handed: list[tuple[np.ndarray, int]] = []

    @property
    def buffers(self) -> SlotTarget | None:
        """What :meth:`Table.sample` takes as ``buffers`` (None: the table's own)."""
        return self if self.segment is not None else None

    def _take(self, nbytes: int) -> int | None:
        off = aligned(self._used)
        if self.segment is None or off + nbytes > self.segment.nbytes:
            return None
        self._used = off + nbytes
        return off

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` in the segment if it fits, else a new one."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        off = self._take(nbytes)
        if off is None:
            return np.empty(shape, dtype)
        out = self.segment.data[off : off + nbytes].view(dtype).reshape(shape)
        self._handed.append((out, off))
        return out

    def place(self, data: dict[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Reply header fields and the arrays still to send for a batch's ``data``.

        Returns:
            ``({"shm": [[name, dtype, shape, offset], ...], "shm_need": bytes}, arrays)``:
            the arrays in the segment, the others as ``"data/<name>"``, and the data
            area the batch needs.
        """
        offsets = {id(a): off for a, off in self._handed}
        entries, rest = [], {}
        need = 0
        for name, a in data.items():
            need = aligned(need) + a.nbytes
            off = offsets.get(id(a))
            dtype = codec.dtype_of(a.dtype.str)
            if off is None and dtype is not None and a.flags.c_contiguous:
                off = self._take(a.nbytes)
                if off is not None:  # made elsewhere: copy in
                    self.segment.data[off : off + a.nbytes] = a.reshape(-1).view(np.uint8)
            if off is None or dtype is None:
                rest["data/" + name] = a
            else:
                entries.append([name, a.dtype.str, list(a.shape), off])
        header: dict[str, Any] = {"shm_need": need}
        if self.segment is not None:
            header["shm"] = entries
        if self.lost:
            header["shm_lost"] = True
        return header, rest


class SharedSegments:
    """The segments each client connection attached (dispatcher thread only)."""

    def __init__(self) -> None:
        self._boot_id = boot_id()
        self._tokens = itertools.count(1)
        self._clients: dict[bytes, dict[int, Segment]] = {}
        self._last_use: dict[bytes, float] = {}

    def __len__(self) -> int:
        return sum(len(s) for s in self._clients.values())

    def attach(self, client: bytes, header: dict, now: float) -> dict[str, Any]:
        """Serve ``shm_attach``: map the client's segment; the reply header.

        Raises:
            ProtocolError: for fields of the wrong type.
            InvalidArgumentError: if the client runs on another host or the segment
                cannot be mapped.
            ResourceLimitError: if the connection holds ``MAX_SEGMENTS_PER_CLIENT``.
        """
        name, nbytes = header.get("name"), header.get("nbytes")
        nonce, boot = header.get("nonce"), header.get("boot_id")
        if not isinstance(name, str) or len(name) > 64:
            raise ProtocolError(f"shm_attach field 'name' is {describe(name)}, not a name")
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SEGMENT_BYTES:
            raise ProtocolError(f"shm_attach field 'nbytes' is {describe(nbytes)}")
        if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
            raise ProtocolError(f"shm_attach field 'nonce' is {describe(nonce)}")
        if not isinstance(boot, str):
            raise ProtocolError(f"shm_attach field 'boot_id' is {describe(boot)}")
        if boot != self._boot_id or not boot:
            raise InvalidArgumentError(
                "the client runs on another host than the server (boot ids differ): shared "
                "memory cannot reach it; samples go through the socket"
            )
        held = self._clients.get(client, {})
        if len(held) >= MAX_SEGMENTS_PER_CLIENT:
            raise ResourceLimitError(
                f"this connection holds {len(held)} shared-memory segments, the most a "
                "server maps for one; detach some"
            )
        try:
            segment = Segment.attach(name, nbytes, nonce)
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(
                f"the server cannot map shared-memory segment {name!r}: {exc} (it must be "
                "created by a process of the server's user on the server's host)"
            ) from None
        token = next(self._tokens)
        self._clients.setdefault(client, {})[token] = segment
        self._last_use[client] = now
        return {"token": token}

    def detach(self, client: bytes, header: dict) -> dict[str, Any]:
        """Serve ``shm_detach``: drop the client's segments listed under ``tokens``."""
        tokens = header.get("tokens")
        if not isinstance(tokens, list) or len(tokens) > 4 * MAX_SEGMENTS_PER_CLIENT:
            raise ProtocolError(f"shm_detach field 'tokens' is {describe(tokens)}")
        held = self._clients.get(client)
        if held is not None:
            for token in tokens:
                if type(token) is int:
                    held.pop(token, None)
            if not held:
                self._forget(client)
        return {}

    def target(self, client: bytes, token: Any, now: float) -> SlotTarget | None:
        """Where a sample request's data goes: None for a request without ``"shm"``.

        Raises:
            ProtocolError: for a token that is not an int.
        """
        if token is None:
            return None
        if type(token) is not int:
            raise ProtocolError(f"sample field 'shm' is {describe(token)}, not a token")
        if token == 0:
            return SlotTarget(None)
        segment = self._clients.get(client, {}).get(token)
        if segment is None:
            return SlotTarget(None, lost=True)
        self._last_use[client] = now
        return SlotTarget(segment)

    def request_arrays(
        self, client: bytes, header: dict, arrays: dict, epoch: int | None, now: float
    ) -> None:
        """Add to ``arrays`` those ``"shm_in"`` places in the client's segment, as read-only
        views. Only step data (``data/...``), which the server copies unread, may come so:
        arrays it checks (keys, anchors, priorities) come in frames, since the client can change
        shared memory after a check.

        Raises:
            ProtocolError: for a malformed ``shm_in`` or an array it may not carry.
            InvalidArgumentError: for a token this connection did not attach (or forgot).
        """
        spec = header.pop("shm_in")
        if header.get("op") not in PLACED_OPS:
            raise ProtocolError(
                f"a {describe(header.get('op'))} request cannot place arrays in shared memory "
                f"(only {', '.join(PLACED_OPS)})"
            )
        if not isinstance(spec, list) or len(spec) != 2 or type(spec[0]) is not int:
            raise ProtocolError(f"request field 'shm_in' is {describe(spec)}")
        segment = self._clients.get(client, {}).get(spec[0])
        if segment is None:
            if header.get("epoch", epoch) != epoch:
                return  # meant for an earlier server: the epoch check refuses it
            raise InvalidArgumentError(
                f"the request's arrays are in shared memory this server does not map (token "
                f"{spec[0]}, forgotten after {IDLE_S:g}s unused); nothing was applied"
            )
        self._last_use[client] = now
        for name, dtype, shape, off, size in check_entries(spec[1], segment.nbytes):
            if not name.startswith("data/"):
                raise ProtocolError(f"array {name!r} cannot come through shared memory")
            if name in arrays:
                raise ProtocolError(f"array {name!r} is given twice")
            a = segment.data[off : off + size].view(dtype).reshape(shape)
            a.flags.writeable = False
            arrays[name] = a

    def forget_idle(self, now: float, idle_s: float = IDLE_S) -> None:
        """Drop the segments of connections that used none for ``idle_s`` seconds."""
        for client in [c for c, t in self._last_use.items() if now - t > idle_s]:
            self._forget(client)

    def _forget(self, client: bytes) -> None:
        self._clients.pop(client, None)
        self._last_use.pop(client, None)

    def clear(self) -> None:
        """Drop every mapping (the server stops)."""
        self._clients.clear()
        self._last_use.clear()
