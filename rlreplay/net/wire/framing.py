"""Sending and receiving one message's frames with the least interpreter work per message:
small ``bytes`` frames are copied, large buffers go without copying."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq

from rlreplay.net.wire.codec import ZERO_COPY_BYTES

_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_LAST = int(zmq.NOBLOCK)


def send(sock: zmq.Socket, frames: Sequence[Any], first: Any = None) -> None:
    """Queue ``frames`` (after ``first``, a ROUTER's routing id, if given) as one message,
    without blocking; ``bytes`` frames under ``ZERO_COPY_BYTES`` are copied.

    Raises:
        zmq.Again: if the socket's queue is full; nothing of the message was queued.
    """
    last = len(frames) - 1
    if first is not None:
        if type(first) is bytes:
            sock.send(first, _MORE)
        else:
            sock.send(first, _MORE, copy=False)
    for i, frame in enumerate(frames):
        flags = _MORE if i < last else _LAST
        if type(frame) is bytes and len(frame) < ZERO_COPY_BYTES:
            sock.send(frame, flags)
        else:
            sock.send(frame, flags, copy=False)


def receive(sock: zmq.Socket) -> list:
    """The next message's frames, uncopied (``recv_multipart(copy=False)``)."""
    frame = sock.recv(0, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(0, copy=False)
        frames.append(frame)
    return frames
