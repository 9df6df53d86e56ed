"""Periodic server checkpoints are skipped while nothing changed (an idle server writes
none), written after any change (a sample, a priority update, in process too, a delete,
a writer's steps), and a checkpoint a client asks for is always written."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

import rlreplay
from rlreplay.checkpoint import list_checkpoints

PERIOD_S = 0.1


def count_settled(ckpt, at_least: int) -> int:
    """The checkpoints in ``ckpt`` once at least ``at_least`` are there and no more came
    for a few periods (bounded: 10 s)."""
    deadline = time.monotonic() + 10.0
    count = len(list_checkpoints(ckpt))
    while count < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
        count = len(list_checkpoints(ckpt))
    time.sleep(4 * PERIOD_S)
    return len(list_checkpoints(ckpt))


def test_periodic_checkpoints_skip_an_idle_server_and_follow_every_change(tmp_path):
    ckpt = tmp_path / "ckpt"
    table = rlreplay.Table(
        "t",
        signature={"x": "float32"},
        max_size=100,
        sampler=rlreplay.Prioritized(0.6),
        seed=1,
    )
    with rlreplay.Server([table], checkpoint_dir=ckpt, checkpoint_every_s=PERIOD_S) as server:
        client = rlreplay.Client(server.address)
        try:
            keys = client.insert("t", {"x": np.arange(8, dtype=np.float32)})
            count = count_settled(ckpt, 1)
            assert count >= 1
            # idle: many periods pass, each one looked at and skipped: nothing is written
            skipped = server.checkpoints.skipped
            time.sleep(10 * PERIOD_S)
            assert len(list_checkpoints(ckpt)) == count
            assert server.checkpoints.skipped >= skipped + 5

            writer = client.trajectory_writer("t", chunk_steps=2)

            def writer_steps() -> None:
                writer.append({"x": np.float32(9)})  # a step, no item: only the store changes
                writer.flush(timeout=5.0)

            changes: dict[str, Callable[[], object]] = {
                "sample": lambda: client.sample("t", 2, timeout=5.0),
                "remote priority update": lambda: client.update_priorities(
                    "t", keys[:2], np.full(2, 5.0)
                ),
                "in-process priority update": lambda: table.update_priorities(
                    keys[2:4], np.full(2, 9.0)
                ),
                "delete": lambda: client.delete("t", keys[:1]),
                "writer steps": writer_steps,
                "writer closed": lambda: writer.close(timeout=5.0),
                "requested while idle": lambda: client.checkpoint(timeout=10.0),
            }
            for what, change in changes.items():
                change()
                now = count_settled(ckpt, count + 1)
                assert now == count + 1, what
                count = now
        finally:
            client.close()
