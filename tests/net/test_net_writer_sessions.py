"""A writer chunk is applied whole or not at all, and refused chunks leave no server state:
no retained steps, no session beyond a per-client bound."""

from __future__ import annotations

import numpy as np
import pytest
from chunkwire import CHUNK_SIG, STORE_STEPS, chunk_steps, items, state, write

import rlreplay
import rlreplay.net
from rlreplay import StepStore, Table
from rlreplay.errors import (
    InvalidArgumentError,
    RateLimiterTimeoutError,
    ResourceLimitError,
)


@pytest.fixture
def serve():
    """Starts a server in this process over one empty store with a queue table "q" (4
    items) and a row table: ``serve(max_writers_per_client=64)`` returns ``(client,
    server, tables)``; both are stopped after the test."""
    started = []

    def start(max_writers_per_client: int = 64):
        store = StepStore(CHUNK_SIG, STORE_STEPS)
        tables = {"q": Table.queue("q", 4, store=store), "rows": Table("rows", store=store)}
        server = rlreplay.net.Server(
            list(tables.values()), max_writers_per_client=max_writers_per_client
        ).start()
        client = rlreplay.Client(server.address, call_timeout=10.0)
        started.append((client, server))
        return client, server, tables

    yield start
    for client, server in started:
        client.close()
        server.stop()


QR = {"tables": ["q", "rows"], "history": 4}


def test_a_chunk_whose_later_episode_meets_a_queue_waits_and_changes_nothing(serve):
    client, _, tables = serve()
    store = tables["q"].store
    # The writer's first step (id 0) carries a queue item; another writer then appends
    # until the store is nearly full, so the writer's retained step is no longer at the head.
    write(client, {**QR, "n": 1}, items([0], [0]))
    store.append(chunk_steps(0, STORE_STEPS - 3))
    before = state(tables)
    # Two episodes: stream step 1 continues the first, step 2 begins the next. Copying
    # the retained step and writing both steps reaches id 0, where the queue's item is.
    chunk = {**QR, "seq": 1, "first": 1, "n": 2, "episode_starts": [2]}
    with pytest.raises(RateLimiterTimeoutError):  # it waits for the queue, no refusal
        write(client, {**chunk, "timeout": 0.3}, items([1], [2]))
    assert state(tables) == before  # not even the first episode's step is stored
    tables["q"].sample(1)  # the queue's item is consumed: its row may be overwritten
    keys = write(client, chunk, items([1], [2]))["keys"]
    assert len(keys) == 1 and store.next_id == before[-1][0] + 3  # the copy and 2 steps
    got = tables["rows"].sample(tables["rows"].size)
    np.testing.assert_array_equal(got.data["obs"][got.info.keys == keys[0]], [[101, -101]])


def test_a_chunk_sent_again_after_its_reply_is_gone_is_told_it_was_applied(serve):
    client, _, tables = serve()
    for k in range(66):  # more chunks than the server keeps replies for (64)
        write(client, {**QR, "seq": k, "first": k, "n": 1, "episode_starts": [0][: k < 1]}, {})
    after = state(tables)
    with pytest.raises(InvalidArgumentError, match="applied too long ago"):
        write(client, {**QR, "seq": 0, "first": 0, "n": 1}, {})
    assert state(tables) == after


def test_refused_first_chunks_leave_no_retained_steps_behind(serve):
    client, server, tables = serve()
    overwrite = tables["q"].store.overwrite
    legit = client.trajectory_writer(["rows"], history=3)
    for i in range(3):
        legit.append({"obs": np.full(2, i, np.float32), "reward": np.float32(i)})
    legit.flush(timeout=5.0)
    for writer in range(20):  # writers whose first chunk is refused for its items
        with pytest.raises(InvalidArgumentError):
            write(client, {**QR, "writer": 5000 + writer}, items([1], [99]))
    assert [r.count for r in overwrite.retentions()] == [3]
    assert len(server._sessions) == 1  # only the writer whose chunk was applied
    legit.create_item("rows")  # its retained steps were not released for the refused ones
    legit.flush(timeout=5.0)
    assert legit.items_acknowledged == 1
    legit.close()


def test_a_client_keeps_at_most_max_writers_per_client_writers(serve):
    client, server, tables = serve(max_writers_per_client=3)
    for writer in range(6):  # writers that each send one chunk and are never heard again
        write(client, {**QR, "writer": writer, "n": 1}, {})
    assert len(server._sessions) == 3 == len(tables["q"].store.overwrite.retentions())
    assert server._sessions.of_client(server.operations.caller) == 3
    # the oldest writer was closed: its next chunk is taken as a new episode
    with pytest.raises(InvalidArgumentError, match="reaches outside"):
        nxt = {**QR, "writer": 0, "seq": 1, "first": 1, "n": 1, "episode_starts": []}
        write(client, nxt, items([1], [0]))


def test_a_new_writer_of_a_client_whose_writers_all_wait_is_refused(serve):
    client, server, tables = serve(max_writers_per_client=2)
    write(client, {**QR, "writer": 1}, items([0] * 4, [0, 1, 2, 3]))  # "q" is full
    one_step = {"data/obs": np.zeros((1, 2), np.float32), "data/reward": np.zeros(1, np.float32)}
    waiting = []  # a chunk of each of two writers, each waiting for room in "q"
    for writer, seq, first in ((1, 1, 4), (2, 0, 0)):
        header = {"op": "write", **QR, "writer": writer, "seq": seq, "first": first, "n": 1}
        header.update(timeout=10.0, episode_starts=[first] if seq == 0 else [])
        waiting.append(client.transport.send(header, {**one_step, **items([0], [first])}))
    before = state(tables)
    with pytest.raises(ResourceLimitError, match="max_writers_per_client=2"):
        write(client, {**QR, "writer": 3}, {})
    assert state(tables) == before and server._sessions.of_client(server.operations.caller) == 2
    tables["q"].sample(2)  # both waiting chunks go through
    for rid in waiting:
        assert len(client.transport.wait(rid, 10.0)[1]["keys"]) == 1
