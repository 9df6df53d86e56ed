"""Process targets for the shared-memory tests (importable by spawned children)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

FRAME = [32, 32, 3]  # 3 KiB: a batch of 32 (96 KiB) travels in shared memory
FRAME_SIGNATURE = {"obs": {"shape": FRAME, "dtype": "uint8"}, "step": "int64"}


def frame_of(steps: np.ndarray) -> np.ndarray:
    """The frame stored for each step: every byte is ``(step * 7 + position) % 251``, so
    any frame read from the wrong row (or overwritten) is detected."""
    size = int(np.prod(FRAME))
    values = (np.asarray(steps, np.int64)[:, None] * 7 + np.arange(size)) % 251
    return values.astype(np.uint8).reshape(len(steps), *FRAME)


def frames_rows(first: int, n: int) -> dict[str, np.ndarray]:
    steps = np.arange(first, first + n, dtype=np.int64)
    return {"obs": frame_of(steps), "step": steps}


def consistent(batch: Any) -> bool:
    """Whether every sampled frame is the frame of its own step."""
    return bool(np.array_equal(batch.data["obs"], frame_of(batch.data["step"])))


def shm_entries() -> set[str]:
    """Names of this library's shared-memory segments that exist now."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("rlreplay-")}


def hold_batches(address: str, table: str, held: int, out: Any, stop: Any) -> None:
    """Child: sample ``held`` batches through shared memory and hold them until killed
    (or ``stop``); reports whether they came through shared memory."""
    from rlreplay.net import Client
    from rlreplay.net.client.shm import is_shared

    try:
        client = Client(address, shared_memory=True)
        client.sample(table, 32)  # learns the slot size
        batches = [client.sample(table, 32) for _ in range(held)]
        shared = all(is_shared(b.data["obs"]) for b in batches)
        out.put(("ok", os.getpid(), shared, all(consistent(b) for b in batches)))
    except Exception as exc:
        out.put(("error", os.getpid(), f"{type(exc).__name__}: {exc}", False))
        return
    stop.wait(120.0)
    del batches


def write_frames(address: str, table: str, first: int, n: int, out: Any) -> None:
    """Child: append steps ``first .. first + n`` (one item each) with a trajectory writer
    whose chunks travel in shared memory; reports whether they did."""
    from rlreplay.net import Client

    try:
        client = Client(address, shared_memory=True)
        rows = frames_rows(first, n)
        with client.trajectory_writer(table, chunk_steps=64) as writer:  # 192 KiB chunks
            for i in range(n):
                writer.append({"obs": rows["obs"][i], "step": rows["step"][i]})
                writer.create_item(table, priority=1.0)
            writer.flush(timeout=60.0)
        placed = bool(client.transport.channel().shm.slots)
        out.put(("ok", first, placed))
    except Exception as exc:
        out.put(("error", first, f"{type(exc).__name__}: {exc}"))
