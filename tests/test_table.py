"""Table behaviour: insert, sample, update, delete, reset, info, eviction, queues, writers."""

from __future__ import annotations

import copy
import pickle
import time

import numpy as np
import pytest
from conftest import Worker, assert_rows_consistent, rows

from rlreplay import (
    Fifo,
    InvalidArgumentError,
    ItemLayout,
    Lifo,
    MaxHeap,
    MinHeap,
    Prioritized,
    Queue,
    RateLimiterTimeoutError,
    ReplayTimeoutError,
    StepStore,
    Table,
    TrajectoryWriter,
    Uniform,
)

STEP_SIGNATURE = {"step": "int64", "episode": "int64", "writer": "int64", "obs": ((2,), "float32")}


def step(i, episode=0, writer=0):
    return {"step": i, "episode": episode, "writer": writer, "obs": np.array([i, -i], np.float32)}


def test_insert_then_sample_returns_the_inserted_rows(make_table):
    table = make_table(max_size=10)
    keys = table.insert(rows(0, 5))
    assert keys.dtype == np.int64 and len(np.unique(keys)) == 5
    batch = table.sample(8)
    assert set(batch.data["step"].tolist()) <= set(range(5))
    assert_rows_consistent(batch.data)
    assert batch.data["obs"].shape == (8, 3) and batch.data["obs"].dtype == np.float32
    slot_of = dict(zip(keys.tolist(), range(5)))
    assert [slot_of[k] for k in batch.info.keys.tolist()] == batch.data["step"].tolist()


def test_a_single_row_without_batch_axis_is_one_item(make_table):
    table = make_table(max_size=10)
    keys = table.insert({"step": 7, "obs": np.ones(3, np.float32) * 7})
    assert len(keys) == 1 and table.size == 1
    assert table.sample(1).data["step"].tolist() == [7]


def test_info_counts_every_kind_of_change(make_table):
    table = make_table(max_size=4, capacity=4)
    keys = table.insert(rows(0, 4))
    table.sample(3)
    assert table.delete(keys[1:2]) == 1
    assert table.update_priorities(keys[:1], [2.0]) == 1
    table.insert(rows(4, 2))  # the ring overwrites step 0 (held) and step 1 (deleted)
    assert table.delete(keys[1:2]) == 0  # stale
    assert table.update_priorities(keys[:1], [3.0]) == 0  # stale: overwritten
    info = table.info()
    assert (info.inserts, info.samples, info.deletes) == (6, 3, 1)
    assert (info.evictions, info.overwrite_evictions) == (0, 1)
    assert (info.stale_updates, info.stale_deletes) == (1, 1)
    assert info.size == len(table) == 4
    assert (info.store_capacity, info.stored_steps, info.max_size) == (4, 4, 4)
    assert set(table.sample(4).data["step"].tolist()) <= {2, 3, 4, 5}
    assert info.to_dict()["size"] == 4


@pytest.mark.parametrize("compiled", [True, False], ids=["kernel", "numpy"])
def test_sampled_items_counts_items_drawn_at_least_once_since_the_last_reset(
    make_table, monkeypatch, compiled
):
    from rlreplay.core import item_draws

    if compiled and item_draws._kernel is None:
        pytest.skip("the compiled draw loops are not built or are turned off")
    if not compiled:
        monkeypatch.setattr(item_draws, "_kernel", None)
    table = make_table(max_size=6, remover=Fifo())
    keys = table.insert(rows(0, 6))
    assert table.info().sampled_items == 0
    drawn: set[int] = set()
    for _ in range(4):  # duplicates within and across batches count once per item
        drawn |= set(table.sample(3).info.keys.tolist())
        assert table.info().sampled_items == len(drawn)
    table.delete(keys[:1])
    table.insert(rows(6, 2))  # evicts one more item: items gone stay counted
    assert table.info().sampled_items == len(drawn)
    new = set(table.sample(6).info.keys.tolist()) - drawn
    assert new and table.info().sampled_items == len(drawn) + len(new)
    table.reset()
    assert table.info().sampled_items == 0


def test_an_index_state_saved_before_sampled_items_counts_the_held_items_drawn(make_table):
    table = make_table(max_size=6)
    table.insert(rows(0, 6))
    drawn = len(set(table.sample(4).info.keys.tolist()))
    with table.mutex:
        state = table.index.state()
    del state["counts"]["sampled_items"]  # as a checkpoint made before the counter
    other = make_table(max_size=6)
    with other.mutex:
        other.index.load_state(state)
    assert other.info().sampled_items == drawn and other.size == 6


def test_update_priorities_and_delete_return_how_many_items_they_changed(make_table):
    table = make_table(max_size=10, sampler=Prioritized(1.0))
    keys = table.insert(rows(0, 4), priorities=[1.0, 1.0, 1.0, 1.0])
    assert table.update_priorities(keys[[0, 0, 2]], [5.0, 0.0, 3.0]) == 2  # duplicates: last wins
    batch = table.sample(10)
    assert 0 not in batch.data["step"].tolist()  # priority 0 after the duplicate update
    assert table.delete(keys[[1, 1]]) == 1
    assert table.delete(keys[[1]]) == 0
    assert table.info().stale_deletes == 1 and table.size == 3


def test_reset_removes_items_and_makes_old_keys_stale(make_table):
    table = make_table(max_size=10)
    keys = table.insert(rows(0, 5))
    table.sample(2)
    table.delete(keys[:1])
    table.reset()
    assert table.size == 0 and not table.can_sample(1)
    info = table.info()
    assert (info.inserts, info.samples) == (0, 0)  # the limiter's counts restart
    assert info.deletes == 1  # the other counters count since creation
    keys = keys[1:]
    assert table.update_priorities(keys, np.ones(len(keys))) == 0
    assert table.delete(keys) == 0
    with pytest.raises(RateLimiterTimeoutError):
        table.sample(1, timeout=0.05)
    table.insert(rows(5, 2))
    assert set(table.sample(6).data["step"].tolist()) <= {5, 6}


def test_max_size_eviction_keeps_the_newest_with_fifo_remover(make_table):
    table = make_table(max_size=5, capacity=20)
    for i in range(0, 12, 3):
        table.insert(rows(i, 3))
    assert table.size == 5 and table.info().evictions == 7
    steps = table.sample(5).data["step"]
    assert set(steps.tolist()) <= set(range(7, 12))


@pytest.mark.parametrize("sampler_cls", [Uniform, Prioritized, Fifo, Lifo, MaxHeap])
def test_max_times_sampled_removes_items_after_their_last_sample(sampler_cls, make_table):
    table = make_table(max_size=10, sampler=sampler_cls(), max_times_sampled=2)
    table.insert(rows(0, 3))
    seen: dict[int, int] = {}
    for _ in range(6):
        batch = table.sample(1)
        s = int(batch.data["step"][0])
        seen[s] = seen.get(s, 0) + 1
        assert batch.info.times_sampled[0] == seen[s]
    assert seen == {0: 2, 1: 2, 2: 2} and table.size == 0


@pytest.mark.parametrize("sampler_cls", [Uniform, Prioritized, Fifo, Lifo, MaxHeap])
def test_max_times_sampled_holds_within_one_batch(sampler_cls, make_table):
    table = make_table(max_size=10, sampler=sampler_cls(), max_times_sampled=2)
    table.insert(rows(0, 3))
    batch = table.sample(6)
    steps = batch.data["step"].tolist()
    assert sorted(steps) == [0, 0, 1, 1, 2, 2]
    for s in range(3):
        assert sorted(batch.info.times_sampled[batch.data["step"] == s].tolist()) == [1, 2]
    assert table.size == 0 and table.info().samples == 6


def test_a_batch_larger_than_what_is_left_is_cut_short(make_table):
    table = make_table(max_size=10, sampler=Uniform(), max_times_sampled=1)
    table.insert(rows(0, 3))
    batch = table.sample(5)
    assert sorted(batch.data["step"].tolist()) == [0, 1, 2]
    assert table.size == 0 and table.info().samples == 3


def test_times_sampled_counts_repeats_within_a_batch(make_table):
    table = make_table(max_size=10, sampler=Fifo())
    table.insert(rows(0, 2))
    assert table.sample(3).info.times_sampled.tolist() == [1, 2, 3]
    assert table.sample(1).info.times_sampled.tolist() == [4]


# ------------------------------------------------------------------ queue and stack


def test_queue_serves_each_item_once_in_order_and_blocks_both_ways():
    table = Table.queue("q", 3, signature={"step": "int64", "obs": ((3,), "float32")})
    table.insert(rows(0, 3))
    assert not table.can_insert(1)
    with pytest.raises(RateLimiterTimeoutError):
        table.insert(rows(3, 1), timeout=0.05)
    assert table.sample(2).data["step"].tolist() == [0, 1]
    table.insert(rows(3, 2))
    assert [int(table.sample(1).data["step"][0]) for _ in range(3)] == [2, 3, 4]
    assert not table.can_sample(1)
    with pytest.raises(RateLimiterTimeoutError):
        table.sample(1, timeout=0.05)
    assert table.info().size == 0


def test_stack_serves_the_newest_first_each_once():
    table = Table.stack("s", 4, signature={"step": "int64", "obs": ((3,), "float32")})
    table.insert(rows(0, 3))
    assert table.sample(1).data["step"].tolist() == [2]
    table.insert(rows(3, 1))
    assert table.sample(3).data["step"].tolist() == [3, 1, 0]
    assert table.size == 0


def test_queue_store_blocks_overwriting_items_not_yet_consumed():
    # A writer feeding a queue waits (then times out) instead of overwriting its items.
    store = StepStore(STEP_SIGNATURE, capacity=4)
    queue = Table.queue("q", 4, store=store)
    writer = TrajectoryWriter(queue)
    for i in range(4):
        writer.append(step(i))
        writer.create_item(queue, timeout=1.0)
    with pytest.raises(ReplayTimeoutError):
        writer.append(step(4), timeout=0.05)
    assert store.next_id == 4
    assert queue.sample(1).data["step"].tolist() == [0]
    writer.append(step(4), timeout=1.0)  # the consumed row may be overwritten now
    writer.create_item(queue, timeout=1.0)
    assert queue.sample(4).data["step"].tolist() == [1, 2, 3, 4]


# ------------------------------------------------------------ keys and priorities


def test_stale_update_after_slot_reuse_does_not_reach_the_new_occupant(make_table):
    table = make_table(max_size=4, capacity=4, sampler=MaxHeap())
    old = table.insert(rows(0, 4), priorities=[1.0, 1.0, 1.0, 1.0])
    new = table.insert(rows(4, 4), priorities=[1.0, 2.0, 3.0, 4.0])  # the same four slots
    assert (old & 0xFFFFFFFF).tolist() == (new & 0xFFFFFFFF).tolist()
    assert table.update_priorities(old, [100.0, 100.0, 100.0, 100.0]) == 0
    assert table.delete(old) == 0
    info = table.info()
    assert (info.stale_updates, info.stale_deletes, info.size) == (4, 4, 4)
    batch = table.sample(1)
    assert batch.data["step"].tolist() == [7] and batch.info.priorities.tolist() == [4.0]
    assert table.update_priorities(new[:1], [9.0]) == 1
    assert table.sample(1).data["step"].tolist() == [4]


def test_update_with_a_mix_of_stale_and_live_keys_applies_only_the_live_ones(make_table):
    table = make_table(max_size=3, capacity=3, sampler=Prioritized(1.0), seed=3)
    old = table.insert(rows(0, 3), priorities=[1.0, 1.0, 1.0])
    new = table.insert(rows(3, 2), priorities=[1.0, 1.0])  # slots 0 and 1 reused
    keys = np.r_[old, new]
    assert table.update_priorities(keys, [0.0, 0.0, 0.0, 5.0, 0.0]) == 3
    steps = table.sample(3).data["step"].tolist()
    assert set(steps) == {3}  # step 2 and 4 have priority 0; step 3 has 5
    assert table.info().stale_updates == 2


@pytest.mark.parametrize(
    "default_priority,expected",
    [(None, [1.0, 5.0, 9.0]), (0.5, [0.5, 0.5, 0.5])],
    ids=["max seen (PER)", "fixed"],
)
def test_default_priority(default_priority, expected, make_table):
    # A MinHeap remover uses priorities, so the table keeps them (a Lifo table with a
    # Fifo remover keeps none: they read as 1.0).
    table = make_table(
        max_size=10, sampler=Lifo(), remover=MinHeap(), default_priority=default_priority
    )
    got = []
    table.insert(rows(0, 1))
    got.append(table.sample(1).info.priorities[0])
    keys = table.insert(rows(1, 2), priorities=[2.0, 5.0])
    table.insert(rows(3, 1))
    got.append(table.sample(1).info.priorities[0])
    table.update_priorities(keys[:1], [9.0])
    table.insert(rows(4, 1))
    got.append(table.sample(1).info.priorities[0])
    assert got == expected


# ------------------------------------------------------- layouts, stores, writers


def transition_setup(capacity=8):
    store = StepStore(STEP_SIGNATURE, capacity=capacity)
    sig = store.signature
    transitions = Table(
        "transitions",
        store=store,
        layout=ItemLayout.transition(sig, next_fields=("obs", "step")),
        sampler=Prioritized(0.6),
        max_size=capacity,
        seed=0,
    )
    sequences = Table(
        "sequences", store=store, layout=ItemLayout.sequence(sig, 3), max_size=capacity, seed=1
    )
    return store, transitions, sequences


def test_transitions_read_next_obs_from_the_next_step():
    store, transitions, _ = transition_setup(capacity=32)
    with TrajectoryWriter([transitions]) as writer:
        for i in range(10):
            writer.append(step(i))
            if i >= 1:
                writer.create_item(transitions, priority=1.0)
    batch = transitions.sample(32)
    s = batch.data["step"]
    np.testing.assert_array_equal(batch.data["next_step"], s + 1)
    np.testing.assert_array_equal(batch.data["next_obs"], np.stack([s + 1, -(s + 1)], 1))
    assert set(s.tolist()) == set(range(9)) and store.num_steps == 10  # obs stored once


def test_sequences_are_consecutive_steps_b_t_shaped():
    _, _, sequences = transition_setup(capacity=32)
    with TrajectoryWriter(sequences) as writer:
        for i in range(8):
            writer.append(step(i))
            if i >= 2:
                writer.create_item(sequences)
    batch = sequences.sample(16)
    assert batch.data["obs"].shape == (16, 3, 2)
    s = batch.data["step"]
    np.testing.assert_array_equal(s - s[:, :1], np.broadcast_to(np.arange(3), s.shape))
    assert set(s[:, 0].tolist()) == set(range(6))


def test_tables_sharing_a_store_lose_items_before_their_steps_are_overwritten():
    store, transitions, sequences = transition_setup(capacity=8)
    writer = TrajectoryWriter([transitions, sequences])
    for i in range(40):
        writer.append(step(i))
        if i >= 1:
            writer.create_item(transitions, priority=float(1 + i % 3))
        if i >= 2:
            writer.create_item(sequences)
        for table in (transitions, sequences):
            if not table.can_sample(1):
                continue
            batch = table.sample(4, timeout=1.0)
            steps = batch.data["step"]
            first = steps if steps.ndim == 1 else steps[:, 0]
            assert (first >= store.oldest_id).all(), "served an overwritten step"
            last = batch.data["next_step"] if steps.ndim == 1 else steps[:, -1]
            assert (last < store.next_id).all()
            np.testing.assert_array_equal(batch.data["obs"][..., 0], steps)
    assert transitions.size == 7 and sequences.size == 6  # every item fully stored
    assert transitions.info().overwrite_evictions == 32
    assert sequences.info().overwrite_evictions == 32


def test_interleaved_writers_produce_contiguous_items_of_their_own_stream():
    store = StepStore(STEP_SIGNATURE, capacity=256)
    layout = ItemLayout.sequence(store.signature, 3)
    table = Table("seq", store=store, layout=layout, sampler=Fifo(), max_times_sampled=1)
    writers = [TrajectoryWriter(table), TrajectoryWriter(table)]
    counts = [0, 0]
    for i in range(30):
        w = i % 2 if i < 20 else (i // 3) % 2  # strict alternation, then runs
        writers[w].append(step(counts[w], writer=w))
        counts[w] += 1
        if counts[w] >= 3:
            writers[w].create_item(table)
    assert sum(w.copied_steps for w in writers) > 0
    batch = table.sample(table.size)
    s, who = batch.data["step"], batch.data["writer"]
    assert (who == who[:, :1]).all(), "an item mixes two streams"
    np.testing.assert_array_equal(s - s[:, :1], np.broadcast_to(np.arange(3), s.shape))
    expected = {(w, k) for w in (0, 1) for k in range(counts[w] - 2)}
    got = [(int(w), int(k)) for w, k in zip(who[:, 0], s[:, 0])]
    assert sorted(got) == sorted(expected) and table.size == 0


@pytest.mark.parametrize("chunk", [1, 7], ids=["append", "append_batch"])
def test_interleaved_writers_in_threads_never_mix_streams(chunk):
    store = StepStore(STEP_SIGNATURE, capacity=4096)
    span, steps_each = 4, 301
    layout = ItemLayout.sequence(store.signature, span)
    table = Table("seq", store=store, layout=layout, sampler=Fifo(), max_times_sampled=1)

    def write(w):
        with TrajectoryWriter(table, history=span + chunk - 1) as writer:
            done = 0
            while done < steps_each:
                n = min(chunk, steps_each - done)
                batch = [step(done + j, writer=w) for j in range(n)]
                if n == 1:
                    writer.append(batch[0])
                else:
                    writer.append_batch({f: np.stack([b[f] for b in batch]) for f in batch[0]})
                for j in range(n):  # one item ending at each new step
                    if done + j >= span - 1:
                        writer.create_item(table, start=-(span + n - 1 - j), timeout=5.0)
                done += n

    workers = [Worker(lambda w=w: write(w)) for w in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.finish(timeout=20.0)
    per_writer = steps_each - span + 1
    assert table.size == 3 * per_writer
    batch = table.sample(table.size)
    s, who = batch.data["step"], batch.data["writer"]
    assert (who == who[:, :1]).all(), "an item mixes two streams"
    np.testing.assert_array_equal(s - s[:, :1], np.broadcast_to(np.arange(span), s.shape))
    got = sorted(zip(who[:, 0].tolist(), s[:, 0].tolist()))
    assert got == [(w, k) for w in range(3) for k in range(per_writer)]


def test_items_never_cross_an_episode_boundary():
    store = StepStore(STEP_SIGNATURE, capacity=64)
    table = Table("seq", store=store, layout=ItemLayout.sequence(store.signature, 3), seed=0)
    writer = TrajectoryWriter(table)
    for episode, length in enumerate([4, 2, 5]):
        for k in range(length):
            writer.append(step(k, episode=episode))
            if k >= 2:
                writer.create_item(table)
            else:
                with pytest.raises(InvalidArgumentError, match="needs 3 steps of this episode"):
                    writer.create_item(table)
        writer.end_episode()
    batch = table.sample(table.size)
    ep = batch.data["episode"]
    assert (ep == ep[:, :1]).all()
    assert table.size == 2 + 0 + 3


def test_writer_rejects_an_item_reaching_past_the_latest_step():
    store = StepStore(STEP_SIGNATURE, capacity=16)
    table = Table("seq", store=store, layout=ItemLayout.sequence(store.signature, 2))
    writer = TrajectoryWriter(table, history=4)
    for k in range(4):
        writer.append(step(k))
    with pytest.raises(InvalidArgumentError, match="start"):
        writer.create_item(table, start=-1)
    key = writer.create_item("seq", start=-3)
    assert table.size == 1 and key >= 0
    assert table.sample(1).data["step"].tolist() == [[1, 2]]


def test_create_item_twice_at_one_anchor_is_rejected():
    store = StepStore(STEP_SIGNATURE, capacity=16)
    table = Table("rows", store=store)
    writer = TrajectoryWriter(table)
    writer.append(step(0))
    writer.create_item(table)
    with pytest.raises(InvalidArgumentError, match="already holds"):
        writer.create_item(table)
    assert table.size == 1 and table.info().inserts == 1


def test_sample_waits_for_an_item_created_by_a_writer_thread():
    store = StepStore(STEP_SIGNATURE, capacity=16)
    table = Table("rows", store=store)
    worker = Worker(lambda: table.sample(1, timeout=5.0))
    worker.start()
    time.sleep(0.05)
    with TrajectoryWriter(table) as writer:
        writer.append(step(3))
        writer.create_item(table)
    assert worker.finish().data["step"].tolist() == [3]


@pytest.mark.parametrize("cls", [Fifo, Lifo])
@pytest.mark.parametrize("n_deleted", [3, 40])  # one by one, and the vectorised unlink
def test_insertion_order_survives_large_deletes(cls, n_deleted, make_table):
    table = make_table(max_size=100, sampler=cls(), remover=cls(), max_times_sampled=1)
    keys = table.insert(rows(0, 100))
    doomed = np.random.default_rng(n_deleted).choice(100, n_deleted, replace=False)
    assert table.delete(keys[doomed]) == n_deleted
    kept = sorted(set(range(100)) - set(doomed.tolist()))
    expected = kept if cls is Fifo else kept[::-1]
    assert table.sample(len(kept)).data["step"].tolist() == expected


@pytest.mark.parametrize("cls", [Fifo, Lifo, Uniform, Prioritized])
def test_a_batch_overwriting_many_items_leaves_the_indexes_consistent(cls, make_table):
    table = make_table(max_size=64, capacity=64, sampler=cls(), max_times_sampled=1)
    table.insert(rows(0, 64))
    table.insert(rows(64, 40))  # overwrites steps 0..39 in one go
    assert table.info().overwrite_evictions == 40 and table.size == 64
    steps = sorted(table.sample(64).data["step"].tolist())
    assert steps == list(range(40, 104)) and table.size == 0


def test_stack_supports_a_steady_push_pop_loop_past_the_ring_capacity():
    table = Table.stack("s", 4, signature={"step": "int64", "obs": ((3,), "float32")})
    table.insert(rows(0, 4))
    for i in range(4, 4 + 3 * table.store.capacity):
        assert table.sample(1, timeout=1.0).data["step"].tolist() == [i - 1]
        table.insert(rows(i, 1), timeout=0.2)
    assert table.size == 4
    # The waiting items moved ahead of the ring as it wrapped, still in push order.
    assert table.info().relocations > 0
    popped = [int(table.sample(1, timeout=1.0).data["step"][0]) for _ in range(4)]
    assert popped == [4 + 3 * table.store.capacity - 1, 2, 1, 0]


def test_a_batch_that_runs_out_of_positive_priorities_is_cut_short_and_keeps_indexes():
    table = Table(
        "t",
        signature={"step": "int64", "obs": ((3,), "float32")},
        max_size=4,
        sampler=Prioritized(1.0),
        max_times_sampled=1,
        seed=0,
    )
    keys = table.insert(rows(0, 3), priorities=[1.0, 0.0, 2.0])
    batch = table.sample(3)
    assert sorted(batch.data["step"].tolist()) == [0, 2]
    assert table.size == table.sampler.size == 1 and table.info().samples == 2
    assert table.delete(keys) == 1
    assert table.size == table.sampler.size == 0
    assert not table.index.remover_active  # max_size reaches capacity: the remover idles


def test_can_sample_is_false_when_every_prioritized_item_has_priority_zero():
    import rlreplay as rr

    table = rr.Table("zero", signature={"x": "float32"}, max_size=8, sampler=rr.Prioritized(1.0))
    table.insert({"x": np.zeros(4)}, priorities=0.0)
    assert not table.can_sample(1)
    with pytest.raises(rr.EmptyTableError):
        table.sample(1)
    table.insert({"x": np.zeros(1)}, priorities=1.0)
    assert table.can_sample(1)


def test_relocated_sequence_items_keep_their_data_and_order():
    store = StepStore({"step": "int64"}, capacity=12)
    layout = ItemLayout.sequence(store.signature, 3)
    stack = Table(
        "s",
        store=store,
        layout=layout,
        sampler=Lifo(),
        remover=Lifo(),
        max_size=4,
        max_times_sampled=1,
        rate_limiter=Queue(4),
        on_overwrite="relocate",
    )
    writer = TrajectoryWriter(stack)
    for i in range(3):
        writer.append({"step": i})
    writer.create_item(stack)  # steps 0..2, pushed first: waits at the bottom
    for i in range(3, 40):
        writer.append({"step": i})
        if i % 3 == 2:
            writer.create_item(stack)
            top = stack.sample(1, timeout=1.0).data["step"][0].tolist()
            assert top == [i - 2, i - 1, i]
    assert stack.info().relocations > 0
    assert stack.sample(1, timeout=1.0).data["step"][0].tolist() == [0, 1, 2]


PICKLINGS = {"pickle": pickle.dumps, "copy": copy.copy, "deepcopy": copy.deepcopy}


@pytest.mark.parametrize("how", PICKLINGS)
def test_pickling_or_copying_a_table_is_refused_saying_to_serve_it(make_table, how):
    table = make_table(max_size=8)
    table.insert(rows(0, 3))
    with pytest.raises(InvalidArgumentError, match=r"'t' cannot be pickled.*Server.*Client"):
        PICKLINGS[how](table)
    assert table.size == 3 and table.sample(1).data["step"].shape == (1,)


def test_a_samples_repr_shows_shapes_and_dtypes_not_the_arrays():
    table = Table("images", signature={"frame": ((84, 84), "uint8"), "r": "float32"}, max_size=8)
    table.insert({"frame": np.zeros((4, 84, 84), np.uint8), "r": np.ones(4, np.float32)})
    text = repr(table.sample(3))
    assert text.startswith("Sample(3 items, data={'frame': uint8[3, 84, 84], 'r': float32[3]}")
    assert "keys=int64[3]" in text and "table_size=4" in text
    assert len(text) < 300 and "\n" not in text
