"""A call a limiter parks on the server goes on as soon as an in-process user of the
served table makes room, not at the server's next periodic re-check."""

from __future__ import annotations

import threading
import time

import numpy as np

from rlreplay import Fifo, SampleToInsertRatio, Table, Uniform
from rlreplay.net import Client, Server

RECHECK_S = 30.0  # far beyond every wait below: only a wake-up lets the parked call go


def ratio_table() -> Table:
    return Table(
        "rows", signature={"x": "float32"}, max_size=1_000, sampler=Uniform(), remover=Fifo(),
        rate_limiter=SampleToInsertRatio(1.0, min_size_to_sample=1, error_buffer=4.0),
    )


def test_an_in_process_sample_lets_a_parked_remote_insert_in_at_once():
    """Three rounds: each insert parks, a sample here makes room, the insert completes
    within 0.3 s (the dispatcher's once-a-second housekeeping would take up to 1 s)."""
    table = ratio_table()
    server = Server([table], recheck_s=RECHECK_S).start()
    try:
        client = Client(server.address)
        client.insert("rows", {"x": np.zeros(5, np.float32)}, timeout=5.0)
        for round_ in range(3):
            while table.can_insert(4):  # until the limiter holds the next inserts back
                table.insert({"x": np.zeros(4, np.float32)})
            inserts = table.info().inserts
            done: list[float] = []

            def insert(done: list[float] = done) -> None:
                client.insert("rows", {"x": np.ones(4, np.float32)}, timeout=10.0)
                done.append(time.monotonic())

            thread = threading.Thread(target=insert, daemon=True)
            thread.start()
            end = time.monotonic() + 5.0
            while not server._parked and time.monotonic() < end:
                time.sleep(0.002)  # until the server parked the insert
            assert server._parked and table.info().inserts == inserts
            start = time.monotonic()
            while not table.can_insert(4):  # room for the parked insert, made here
                table.sample(1, timeout=1.0)
            thread.join(10.0)
            assert done, f"round {round_}: the parked insert did not complete"
            assert done[0] - start < 0.3, f"round {round_}: {done[0] - start:.3f}s"
            assert table.info().inserts == inserts + 4
        client.close()
    finally:
        server.stop()


def test_a_server_stopped_leaves_no_waker_on_the_store():
    table = ratio_table()
    server = Server([table], recheck_s=RECHECK_S).start()
    assert len(table.store.wakers) == 1
    server.stop()
    assert table.store.wakers == ()
