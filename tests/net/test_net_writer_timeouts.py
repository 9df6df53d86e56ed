"""A remote writer under rate-limiter backpressure stores exactly what an in-process writer
stores: a chunk sent because it holds as many items as a limiter admits at once, an episode
that ends right after it, and writer calls that time out lose and repeat nothing."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlreplay import (
    Fifo,
    ItemLayout,
    SampleToInsertRatio,
    Table,
)
from rlreplay.net import Client, Server

ROWS_SIG = {"obs": ((2,), "float32")}


def limited_rows_table() -> Table:
    """One-step items; the limiter admits 3 items per chunk (its insert window) and 12
    before any sample."""
    return Table(
        "rows",
        signature=ROWS_SIG,
        layout=ItemLayout.rows(ROWS_SIG),
        capacity=64,
        max_size=64,
        sampler=Fifo(),
        rate_limiter=SampleToInsertRatio(1.0, min_size_to_sample=10, error_buffer=2.0),
    )


def wait_for(condition, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out waiting for the server"
        time.sleep(0.005)


def stored_obs(table: Table) -> list[float]:
    rows = np.flatnonzero(table.index.live)
    return sorted(table.store.columns["obs"][rows, 0].tolist())


@pytest.mark.parametrize("interleaved", [False, True], ids=["alone", "another_writer_between"])
def test_items_of_an_episode_sent_after_its_steps_survive_an_episode_end_at_a_chunk_start(
    interleaved,
):
    """The 4th item of an episode goes in the chunk after the one its window filled; when
    the episode ends before the next step, that chunk begins a new episode at its first
    step and still carries the item over the previous episode's steps (which stay where
    the item reads them also when another writer appended in between)."""
    table = limited_rows_table()
    server = Server([table]).start()
    try:
        client = Client(server.address)
        assert client.describe("rows")["insert_window"] == 3
        with client.trajectory_writer("rows", history=8, chunk_steps=32) as writer:
            for k in range(4):
                writer.append({"obs": np.array([k, 0], np.float32)})
            for start in (-4, -3, -2, -1):  # the window fills at 3: a chunk goes out
                writer.create_item("rows", start=start)
            writer.end_episode()
            if interleaved:  # the first chunk is stored, then another stream's steps
                wait_for(lambda: table.size == 3)
                with client.trajectory_writer("rows") as other:
                    other.append_batch({"obs": np.full((5, 2), -1, np.float32)})
            for k in (10, 11):
                writer.append({"obs": np.array([k, 0], np.float32)})
                writer.create_item("rows")
            writer.flush(timeout=5.0)
        assert stored_obs(table) == [0, 1, 2, 3, 10, 11]
    finally:
        server.stop()
