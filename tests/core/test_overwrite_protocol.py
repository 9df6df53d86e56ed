"""The overwrite protocol: writers' contiguous protected steps, tables sharing a store.

Steps carry ``(writer, index)`` so every sampled item can check that its window holds
consecutive steps of one writer: no item is ever served with a step it did not anchor.
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
from overwrite_checks import assert_consistent, check_window

from rlreplay import ItemLayout, StepStore, Table, TrajectoryWriter
from rlreplay.errors import ClosedError, InvalidArgumentError, ReplayTimeoutError

SIGNATURE = {"w": "int64", "i": "int64"}


def step(w: int, i: int) -> dict:
    return {"w": np.int64(w), "i": np.int64(i)}


def steps(w: int, first: int, n: int) -> dict:
    return {"w": np.full(n, w, dtype=np.int64), "i": np.arange(first, first + n, dtype=np.int64)}


def wait_until_blocked(store: StepStore, waiters: int = 1, limit_s: float = 5.0) -> None:
    """Wait (bounded) until ``waiters`` calls wait on the store."""
    deadline = time.monotonic() + limit_s
    while len(store.waits.blocked) < waiters:
        assert time.monotonic() < deadline, "the call never blocked"
        time.sleep(0.005)


def run_thread(target) -> tuple[threading.Thread, list]:
    out: list = []

    def body():
        try:
            out.append(("ok", target()))
        except BaseException as exc:  # handed to the test thread
            out.append(("error", exc))

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


# ---------------------------------------------------------------- the store
def test_an_append_of_more_steps_than_the_capacity_is_refused_before_anything_changes():
    store = StepStore(SIGNATURE, capacity=4)
    table = Table("t", store=store)
    table.insert(steps(0, 0, 4))
    before = {p: c.copy() for p, c in store.columns.items()}
    with store.mutex, pytest.raises(InvalidArgumentError, match="capacity=4"):
        store._append_locked(steps(1, 0, 5), 5)  # the server's path, below append()
    assert store.next_id == 4 and len(table) == 4
    for path, col in store.columns.items():
        np.testing.assert_array_equal(col, before[path])
    assert_consistent([table])


def test_removing_slots_that_hold_no_item_raises_and_changes_nothing():
    table = Table("t", signature=SIGNATURE, max_size=4)
    table.insert(steps(0, 0, 2))
    with table.mutex, pytest.raises(InvalidArgumentError, match="do not all hold items"):
        table.index.remove(np.array([0, 3]))  # slot 3 holds nothing
    assert len(table) == 2 and table.index.live[:2].all()
    assert_consistent([table])


def test_a_lone_evicting_table_uses_the_in_place_row_path():
    table = Table("t", signature=SIGNATURE, max_size=4)
    assert table.store.overwrite.sole is table.store_ref
    other = Table("u", store=table.store)
    assert table.store.overwrite.sole is None
    other.close()
    assert table.store.overwrite.sole is table.store_ref
    dropped = Table("v", store=table.store)
    assert table.store.overwrite.sole is None
    del dropped
    gc.collect()
    table.insert(step(0, 0))  # the next hand-over notices the dropped table
    assert table.store.overwrite.sole is table.store_ref


# ----------------------------------------------------------------- writers
def test_a_writer_blocked_by_a_queue_keeps_its_steps_contiguous_when_another_appends():
    store = StepStore(SIGNATURE, capacity=4)
    queue = Table.queue("q", 4, store=store)
    a = TrajectoryWriter(queue, history=3)
    b = TrajectoryWriter(queue, history=3)
    a.append(step(1, 0))
    b.append(step(2, 0))
    b.create_item(queue)  # a queue item on row 1
    b.end_episode()
    a.append(step(1, 1))  # a's step 0 is copied to the head first: rows 2, 3
    thread, out = run_thread(lambda: a.append_batch(steps(1, 2, 2), timeout=5.0))
    wait_until_blocked(store)  # rows 0, 1 are next; row 1 holds the queue's item
    b.append(step(2, 1))  # row 0 is free: b goes first
    queue.sample(1)  # the item on row 1 is consumed: a may go on
    thread.join(5.0)
    assert out and out[0][0] == "ok", out
    ids = a.episode_step_ids
    assert ids == list(range(ids[0], ids[0] + 3))
    keys = a.create_items(queue, starts=[-3, -2, -1])
    assert len(keys) == 3
    got = queue.sample(3).data
    np.testing.assert_array_equal(got["w"], [1, 1, 1])
    np.testing.assert_array_equal(got["i"], [1, 2, 3])


def test_steps_a_writer_retains_are_not_overwritten_by_another_writer():
    store = StepStore(SIGNATURE, capacity=8)
    layout = ItemLayout.sequence(store.signature, 3)
    table = Table("seq", store=store, layout=layout)
    a = TrajectoryWriter(table, history=3)
    b = TrajectoryWriter(table, history=3)
    a.append(step(1, 0))
    a.append(step(1, 1))
    for i in range(20):  # b wraps the ring many times while a holds two steps
        b.append(step(2, i))
    a.append(step(1, 2))
    a.create_item(table)
    assert a.copied_steps >= 2
    check_window(table.sample(8).data, span=3)
    assert_consistent([table])


def test_a_store_too_small_for_what_writers_retain_raises_before_anything_changes():
    store = StepStore(SIGNATURE, capacity=4)
    table = Table("t", store=store)
    a = TrajectoryWriter(table, history=3)
    b = TrajectoryWriter(table, history=3)
    a.append_batch(steps(1, 0, 3))
    b.append(step(2, 0))
    before = (store.next_id, a.episode_step_ids, b.episode_step_ids)
    with pytest.raises(InvalidArgumentError, match="cannot hold the steps writers retain"):
        b.append(step(2, 1))
    assert (store.next_id, a.episode_step_ids, b.episode_step_ids) == before
    a.end_episode()  # released: b may go on
    b.append(step(2, 1))
    assert b.episode_step_ids[-2:] == [store.next_id - 2, store.next_id - 1]


def test_a_dropped_writer_releases_its_steps():
    store = StepStore(SIGNATURE, capacity=4)
    table = Table("t", store=store)
    a = TrajectoryWriter(table, history=3)
    a.append_batch(steps(1, 0, 3))
    b = TrajectoryWriter(table, history=3)
    b.append(step(2, 0))
    del a
    gc.collect()
    b.append(step(2, 1))  # a's steps no longer count against the store
    assert len(store.overwrite.retentions()) == 1


# ------------------------------------------------------------------ tables
def test_appends_by_others_while_an_insert_waits_in_the_store_leave_no_dead_item():
    store = StepStore(SIGNATURE, capacity=4)
    table = Table("t", store=store)
    queue = Table.queue("q", 4, store=store)
    writer = TrajectoryWriter(queue, history=1)
    table.insert(steps(1, 0, 2))  # rows 0, 1
    writer.append(step(9, 0))
    writer.create_item(queue)  # row 2: the queue's item
    writer.end_episode()
    table.insert(step(1, 3))  # row 3
    thread, out = run_thread(lambda: table.insert(steps(1, 4, 3), timeout=5.0))
    wait_until_blocked(store)  # rows 0..2 are next; row 2 holds the queue's item
    writer.append(step(9, 1))  # row 0: the table's item there is evicted
    writer.append(step(9, 2))  # row 1: likewise
    assert_consistent([table])
    queue.sample(1)  # the insert may go on: rows 2, 3, 0
    thread.join(5.0)
    assert out and out[0][0] == "ok", out
    assert_consistent([table])
    assert len(table) == 3
    got = [table.sample(4).data for _ in range(16)]
    assert all((g["w"] == 1).all() for g in got)
    np.testing.assert_array_equal(np.unique([g["i"] for g in got]), [4, 5, 6])


def test_close_wakes_an_insert_waiting_in_the_store_with_closed_error():
    store = StepStore(SIGNATURE, capacity=2)
    queue = Table.queue("q", 2, store=store)
    table = Table("t", store=store)
    queue.insert(steps(0, 0, 2))
    thread, out = run_thread(lambda: table.insert(step(1, 0), timeout=5.0))
    wait_until_blocked(store)
    table.close()
    thread.join(5.0)
    assert out and isinstance(out[0][1], ClosedError), out


def test_closing_or_dropping_a_queue_lets_blocked_appends_go_on():
    store = StepStore(SIGNATURE, capacity=2)
    queue = Table.queue("q", 2, store=store)
    queue.insert(steps(0, 0, 2))
    thread, out = run_thread(lambda: store.append(steps(1, 0, 1), timeout=5.0))
    wait_until_blocked(store)
    queue.close()
    thread.join(5.0)
    assert out and out[0][0] == "ok", out
    second = Table.queue("q2", 2, store=store)
    second.insert(steps(2, 0, 2))
    with pytest.raises(ReplayTimeoutError):
        store.append(steps(3, 0, 1), timeout=0.05)
    del second
    gc.collect()
    store.append(steps(3, 0, 1), timeout=0.05)


def test_an_append_waiting_for_a_dropped_queue_goes_on():
    store = StepStore(SIGNATURE, capacity=2)
    queue = Table.queue("q", 2, store=store)
    queue.insert(steps(0, 0, 2))
    thread, out = run_thread(lambda: store.append(steps(1, 0, 1), timeout=10.0))
    wait_until_blocked(store)
    start = time.monotonic()
    del queue  # nobody holds the queue any more: its items stop holding rows
    gc.collect()
    thread.join(8.0)
    assert out and out[0][0] == "ok", out
    assert time.monotonic() - start < 8.0  # within a few polls, well before its timeout


def test_a_queue_of_sequences_holds_size_items_of_its_span():
    signature = StepStore(SIGNATURE, 1).signature
    layout = ItemLayout.sequence(signature, 4)
    queue = Table.queue("q", 4, signature=SIGNATURE, layout=layout)
    writer = TrajectoryWriter(queue)
    for i in range(16):
        writer.append(step(1, i), timeout=1.0)
        if i % 4 == 3:
            writer.create_item(queue, timeout=1.0)
    assert len(queue) == 4
    assert not queue.can_insert()
    got = queue.sample(4).data["i"]
    np.testing.assert_array_equal(got[:, 0], [0, 4, 8, 12])


def test_can_insert_is_false_when_the_store_would_block_the_insert():
    store = StepStore(SIGNATURE, capacity=2)
    first = Table.queue("a", 2, store=store)
    second = Table.queue("b", 2, store=store)
    first.insert(steps(0, 0, 2))
    assert second.rate_limiter.can_insert(1, len(second))
    assert not second.can_insert()
    with pytest.raises(ReplayTimeoutError):
        second.insert(step(1, 0), timeout=0.05)
    first.sample(1)
    assert second.can_insert()
    second.insert(step(1, 0), timeout=0.05)


def test_a_stack_relocates_its_oldest_items_for_writers():
    store = StepStore(SIGNATURE, capacity=6)
    stack = Table.stack("s", 2, store=store)
    table = Table("t", store=store)
    writer = TrajectoryWriter([stack, table], history=1)
    for i in range(2):
        writer.append(step(1, i))
        writer.create_item(stack)
    for i in range(2, 12):
        writer.append(step(1, i))
        writer.create_item(table)
    assert stack.info().relocations > 0
    got = stack.sample(2).data["i"]
    np.testing.assert_array_equal(got, [1, 0])
    for t in (stack, table):
        assert_consistent([t])


def test_has_room_agrees_with_make_room_when_the_writers_steps_are_not_at_the_head():
    """A writer whose retained steps another writer has appended after must have them
    copied to the head first; has_room counts those rows as make_room does."""
    store = StepStore({"x": "int64"}, capacity=8)
    queue = Table.queue("q", 4, store=store, layout=ItemLayout.rows(store.signature))
    first = TrajectoryWriter(queue, history=4)
    first.append({"x": 0})
    first.append({"x": 1})
    first.create_item(queue, start=-2)
    first.create_item(queue, start=-1)
    second = TrajectoryWriter(queue, history=4)
    second.append({"x": 2})
    second.append({"x": 3})
    own = first._retention
    with store.mutex:
        assert store.overwrite.has_room(4, own, 2) is False
        assert store.overwrite.make_room(4, own, 2) is None
        assert store.overwrite.has_room(2) is True
