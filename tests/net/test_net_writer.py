"""The remote writer stores exactly what a local TrajectoryWriter stores for the same calls."""

from __future__ import annotations

import time

import numpy as np
import pytest
from chunkwire import CHUNK_SIG, STORE_STEPS, chunk_steps, items, state, write
from netprocs import config, served

import rlreplay
import rlreplay.net
from rlreplay import Fifo, ItemLayout, StepStore, Table, TrajectoryWriter
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    ProtocolError,
    RateLimiterTimeoutError,
)

SIG = {"obs": ((2,), "float32"), "reward": "float32"}
SIG_CFG = {"obs": {"shape": [2], "dtype": "float32"}, "reward": "float32"}

# name -> (layout config, layout factory, item start offsets used per step)
LAYOUTS = {
    "rows": ("rows", lambda s: ItemLayout.rows(s), (None,)),
    "nstep3": (
        {"type": "transition", "n_step": 3},
        lambda s: ItemLayout.transition(s, n_step=3),
        (None,),
    ),
    "seq4_lagged": ({"type": "sequence", "length": 4}, lambda s: ItemLayout.sequence(s, 4), (-5,)),
}
EPISODES = (7, 1, 12, 3, 20, 5)


def table_cfg(name: str, layout) -> dict:
    return {
        "name": name,
        "signature": SIG_CFG,
        "capacity": 4000,
        "max_size": 4000,
        "layout": layout,
        "sampler": {"type": "Fifo"},
    }


@pytest.fixture(scope="module")
def address():
    cfg = config(
        *(table_cfg(n, layout) for n, (layout, _, _) in LAYOUTS.items()),
        {
            "name": "limited",
            "signature": SIG_CFG,
            "capacity": 100,
            "rate_limiter": {
                "type": "SampleToInsertRatio",
                "samples_per_insert": 1.0,
                "min_size_to_sample": 1,
                "error_buffer": 3.0,
            },
        },
    )
    with served(cfg) as (addr, _):
        yield addr


def drive(writer, table: str, starts, history_ok) -> None:
    """One fixed script of appends, items and episode ends."""
    k = 0
    for length in EPISODES:
        for _ in range(length):
            writer.append({"obs": np.array([k, -k], np.float32), "reward": np.float32(k)})
            k += 1
            for start in starts:
                if history_ok(start):
                    writer.create_item(table, 1.0, start=start)
        writer.end_episode()


@pytest.mark.parametrize("chunk_steps", [1, 3, 64])
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_remote_writer_creates_the_same_items_as_a_local_writer(address, name, chunk_steps):
    _, make_layout, starts = LAYOUTS[name]
    store = StepStore(SIG, 4000)
    local = Table(name, store=store, layout=make_layout(store.signature), sampler=Fifo())
    span = local.layout.span
    history = max(span, 5)

    counter = {"n": 0}

    def history_ok_factory():
        def ok(start):
            s = -span if start is None else start
            return counter["n"] >= -s and s + span <= 0

        return ok

    class Counting:
        def __init__(self, w):
            self.w = w

        def append(self, step):
            counter["n"] += 1
            self.w.append(step)

        def create_item(self, *a, **k):
            self.w.create_item(*a, **k)

        def end_episode(self):
            counter["n"] = 0
            self.w.end_episode()

    with TrajectoryWriter(local, history=history) as w:
        drive(Counting(w), name, starts, history_ok_factory())
    client = rlreplay.Client(address)
    client.reset(name)
    counter["n"] = 0
    with client.trajectory_writer(name, history=history, chunk_steps=chunk_steps) as w:
        drive(Counting(w), name, starts, history_ok_factory())
        w.flush(timeout=10.0)
    assert client.info(name).size == local.size > 0
    want = local.sample(local.size)
    got = client.sample(name, local.size, timeout=5.0)
    for field in want.data:
        np.testing.assert_array_equal(got.data[field], want.data[field], err_msg=field)


WRITER_ERRORS = {
    "start_beyond_episode": lambda w: (w.append(STEP), w.create_item("rows", start=-2)),
    "start_not_negative": lambda w: (w.append(STEP), w.create_item("rows", start=0)),
    "unknown_table": lambda w: (w.append(STEP), w.create_item("nope")),
    "duplicate_anchor": lambda w: (w.append(STEP), w.create_item("rows"), w.create_item("rows")),
    "negative_priority": lambda w: (w.append(STEP), w.create_item("rows", priority=-1.0)),
    "text_priority": lambda w: (w.append(STEP), w.create_item("rows", priority="high")),
    "float_start": lambda w: (w.append(STEP), w.create_item("rows", start=-1.0)),
    "float_starts": lambda w: (w.append(STEP), w.create_items("rows", starts=[-1.5])),
    "bad_step": lambda w: w.append({"obs": np.zeros(3, np.float32), "reward": np.float32(0)}),
    "items_before_episode": lambda w: (
        w.append(STEP),
        w.end_episode(),
        w.append(STEP),
        w.create_item("rows", start=-2),
    ),
}
STEP = {"obs": np.zeros(2, np.float32), "reward": np.float32(0)}


@pytest.mark.parametrize("case", sorted(WRITER_ERRORS))
def test_remote_writer_rejects_bad_calls_like_the_local_writer(address, case):
    store = StepStore(SIG, 100)
    local = Table("rows", store=store, sampler=Fifo())
    with pytest.raises(InvalidArgumentError), TrajectoryWriter(local, history=1) as w:
        WRITER_ERRORS[case](w)
    client = rlreplay.Client(address)
    with pytest.raises(InvalidArgumentError), client.trajectory_writer("rows") as w:
        WRITER_ERRORS[case](w)


@pytest.mark.parametrize("length", [0, -1, 2.5, "3"])
def test_a_bad_length_is_named_by_the_local_and_the_remote_writer(address, length):
    store = StepStore(SIG, 100)
    local = Table("rows", store=store, sampler=Fifo())
    client = rlreplay.Client(address)
    for writer in (TrajectoryWriter(local, history=3), client.trajectory_writer("rows", history=3)):
        with writer as w:
            w.append(STEP)
            w.append(STEP)
            with pytest.raises(InvalidArgumentError, match=f"length={length!r}"):
                w.create_item("rows", length=length)
    assert local.size == 0


@pytest.mark.parametrize(
    ("name", "length", "words"),
    [
        ("nstep3", 5, "length=5 "),  # more than the span of 4
        ("rows", 2, "length=2 "),  # more than the span of 1
        ("seq4_lagged", 2, "fixed-span layout"),  # no per-item extents
    ],
    ids=["beyond_the_span", "beyond_a_span_of_one", "fixed_span"],
)
def test_a_length_the_table_cannot_take_is_refused_before_anything_is_sent(
    address, name, length, words
):
    make_layout = LAYOUTS[name][1]
    store = StepStore(SIG, 100)
    local = Table(name, store=store, layout=make_layout(store.signature), sampler=Fifo())
    client = rlreplay.Client(address)
    client.reset(name)
    for writer in (TrajectoryWriter(local, history=6), client.trajectory_writer(name, history=6)):
        with writer as w:
            for _ in range(6):
                w.append(STEP)
            with pytest.raises(InvalidArgumentError, match=words):
                w.create_item(name, length=length)
            w.flush(timeout=10.0)
    assert local.size == 0 and client.info(name).size == 0


def test_entering_a_closed_remote_writer_raises_closed_error(address):
    writer = rlreplay.Client(address).trajectory_writer("rows")
    writer.close()
    with pytest.raises(ClosedError, match="closed"), writer:
        pass


def test_a_writer_naming_a_table_twice_is_refused_locally_and_remotely(address):
    store = StepStore(SIG, 100)
    local = Table("rows", store=store, sampler=Fifo())
    with pytest.raises(InvalidArgumentError, match="twice"):
        TrajectoryWriter([local, local])
    assert store.overwrite.retentions() == []  # no writer was set up
    client = rlreplay.Client(address)
    with pytest.raises(InvalidArgumentError, match="twice"):
        client.trajectory_writer(["rows", "rows"])


def test_a_create_item_refused_for_its_priority_leaves_its_anchor_free(address):
    client = rlreplay.Client(address)
    with client.trajectory_writer("rows") as w:
        w.append(STEP)
        with pytest.raises(InvalidArgumentError, match="priority"):
            w.create_item("rows", priority=-1.0)
        w.create_item("rows", priority=1.0)  # the same anchor, now with a valid priority


def test_writer_flush_raises_the_rate_limiters_timeout(address):
    client = rlreplay.Client(address)
    client.reset("limited")
    w = client.trajectory_writer("limited", chunk_steps=8)
    for i in range(6):
        w.append({"obs": np.full(2, i, np.float32), "reward": np.float32(i)})
        w.create_item("limited")
    with pytest.raises(RateLimiterTimeoutError):
        w.flush(timeout=0.3)
    info = client.info("limited")
    assert info.size == 4  # diff may reach max_diff = 1 + 3 before inserts block
    assert info.insert_blocked_s >= 0.25


def test_writer_exposes_tables_and_batch_item_creation_for_adders(address):
    client = rlreplay.Client(address)
    client.reset("nstep3")
    with client.trajectory_writer("nstep3", history=8, chunk_steps=4) as w:
        assert [t.name for t in w.tables] == ["nstep3"]
        assert w.tables[0].layout.span == 4
        for k in range(10):
            w.append({"obs": np.array([k, -k], np.float32), "reward": np.float32(k)})
        w.create_items("nstep3", [1.0, 2.0], starts=[-8, -4])
        with pytest.raises(InvalidArgumentError):
            w.create_items("nstep3", None, starts=[-2])  # would need steps not appended
        w.flush(timeout=5.0)
    assert client.info("nstep3").size == 2
    oldest = client.sample("nstep3", 1, timeout=5.0)  # Fifo sampler: the oldest item
    assert (oldest.data["obs"][0, 0], oldest.data["next_obs"][0, 0]) == (2.0, 5.0)
    assert oldest.info.priorities[0] == 1.0


# ------------------------------------------------------------------ chunks on the wire
# A served store that is full before each case, so a chunk the server wrongly applied
# would overwrite (and evict) the items already there.


@pytest.fixture
def chunk_server():
    """A server in this process over one full store with a sequence table (span 3) and
    a row table; yields ``(client, tables)``."""
    store = StepStore(CHUNK_SIG, STORE_STEPS)
    seq = Table("seq", store=store, layout=ItemLayout.sequence(store.signature, 3))
    rows = Table("rows", store=store)
    first = store.append(chunk_steps(0, STORE_STEPS))
    seq.create_items(np.arange(first, first + STORE_STEPS - 2))
    rows.create_items(np.arange(first, first + STORE_STEPS))
    server = rlreplay.net.Server([seq, rows]).start()
    client = rlreplay.Client(server.address, call_timeout=10.0)
    try:
        yield client, {"seq": seq, "rows": rows}
    finally:
        client.close()
        server.stop()


# name -> (header changes, arrays, error): every one is refused and changes nothing.
BAD_CHUNKS = {
    "anchor_beyond_the_chunk": ({}, items([0], [3]), InvalidArgumentError),
    "anchor_far_beyond_the_chunk": ({}, items([1], [10_000]), InvalidArgumentError),
    "anchor_before_the_writers_history": ({"first": 0}, items([1], [-1]), InvalidArgumentError),
    "anchor_before_the_stream": ({}, items([1], [-(2**40)]), InvalidArgumentError),
    "huge_unsigned_anchor": (
        {},
        {**items([1], [0]), "item_anchor": np.array([2**63], np.uint64)},
        InvalidArgumentError,
    ),
    "item_across_an_episode_start": (
        {"episode_starts": [0, 2]},
        items([0], [0]),
        InvalidArgumentError,
    ),
    "table_index_out_of_range": ({}, items([2], [0]), InvalidArgumentError),
    "negative_table_index": ({}, items([-1], [0]), InvalidArgumentError),
    "negative_priority": ({}, items([1], [0], [-1.0]), InvalidArgumentError),
    "infinite_priority": ({}, items([1], [0], [np.inf]), InvalidArgumentError),
    "length_on_a_fixed_span_table": ({}, items([0], [0], lengths=[2]), InvalidArgumentError),
    "zero_length": ({}, items([1], [0], lengths=[0]), InvalidArgumentError),
    "duplicate_anchor": ({}, items([1, 1], [0, 0]), InvalidArgumentError),
    "second_table_item_bad": ({}, items([1, 0], [0, 2]), InvalidArgumentError),
    "item_arrays_differ": ({}, {**items([1], [0]), "item_anchor": np.array([0, 1])}, ProtocolError),
    "item_arrays_missing": ({}, {"item_anchor": np.array([0])}, ProtocolError),
    "steps_of_the_wrong_dtype": ({}, {"data/reward": np.zeros(4, np.float64)}, ProtocolError),
    "steps_fewer_than_n": ({"n": 5}, {"data/obs": np.zeros((4, 2), np.float32)}, ProtocolError),
    "field_not_in_the_signature": ({}, {"data/nope": np.zeros(4, np.float32)}, ProtocolError),
    "episode_start_outside_the_chunk": ({"episode_starts": [9]}, {}, ProtocolError),
    "first_not_an_int": ({"first": 1.5}, {}, ProtocolError),
    "n_not_an_int": ({"n": "4"}, {}, ProtocolError),
    "chunk_larger_than_the_store": (
        {"n": STORE_STEPS},
        {
            "data/obs": np.zeros((STORE_STEPS, 2), np.float32),
            "data/reward": np.zeros(STORE_STEPS, np.float32),
        },
        InvalidArgumentError,
    ),
    "tables_not_a_list": ({"tables": "seq"}, {}, InvalidArgumentError),
    # both indices are one table: the items collide only once they reach that table
    "table_named_twice": ({"tables": ["seq", "seq"]}, items([0, 1], [0, 0]), InvalidArgumentError),
    "writer_id_a_float": ({"writer": 1.5}, {}, ProtocolError),
}


@pytest.mark.parametrize("case", sorted(BAD_CHUNKS))
def test_a_malformed_chunk_is_refused_before_anything_changes(chunk_server, case):
    client, tables = chunk_server
    header, arrays, error = BAD_CHUNKS[case]
    before = state(tables)
    with pytest.raises(error):
        write(client, header, arrays)
    assert state(tables) == before
    # the writer's stream is untouched: a valid first chunk is still applied
    keys = write(client, {}, items([0, 1], [0, 3]))["keys"]
    assert len(keys) == 2 and tables["rows"].size == STORE_STEPS - 4 + 1


def test_a_chunk_sent_again_is_applied_once_and_answered_with_its_keys(chunk_server):
    client, tables = chunk_server
    first = write(client, {}, items([1, 1], [0, 1]))["keys"]
    after = state(tables)
    again = write(client, {}, items([1, 1], [0, 1]))["keys"]
    np.testing.assert_array_equal(again, first)
    assert state(tables) == after
    # still answered once the stream has moved on to a new episode
    write(client, {"seq": 1, "first": 4, "episode_starts": [4]}, items([1], [5]))
    after = state(tables)
    np.testing.assert_array_equal(write(client, {}, items([1, 1], [0, 1]))["keys"], first)
    assert state(tables) == after
    with pytest.raises(InvalidArgumentError, match="was not applied"):  # 2..4 never came
        write(client, {"seq": 5, "first": 8, "episode_starts": []}, items([1], [8]))
    assert state(tables) == after


def test_a_server_that_forgot_a_writer_takes_its_next_chunk_as_a_new_episode(chunk_server):
    client, _ = chunk_server
    keys = write(client, {"seq": 7, "first": 40, "episode_starts": []}, items([1], [41]))
    assert len(keys["keys"]) == 1
    with pytest.raises(InvalidArgumentError, match="reaches outside"):  # before the episode
        write(client, {"seq": 8, "first": 44, "episode_starts": []}, items([1], [39]))


def test_a_chunk_blocked_past_its_timeout_stores_nothing_and_is_sent_again(address):
    # "limited": ratio 1 with error_buffer 3 admits 4 items ahead of the samples, so a
    # chunk of 4 is admitted and the next one waits for samples.
    client = rlreplay.Client(address)
    client.reset("limited")
    steps = client.info("limited").stored_steps
    w = client.trajectory_writer("limited", chunk_steps=50, keep_keys=True)
    for i in range(6):
        w.append({"obs": np.full(2, i, np.float32), "reward": np.float32(i)})
        w.create_item("limited")
    with pytest.raises(RateLimiterTimeoutError, match="sends it again"):
        w.flush(timeout=0.3)
    info = client.info("limited")
    # all of the first chunk (5 steps, 4 items: as many as the limiter admits at once),
    # nothing of the second (1 step, 2 items)
    assert (info.size, info.stored_steps - steps, info.inserts) == (4, 5, 4)
    assert w.pending_chunks == 1 and w.items_acknowledged == 4
    client.sample("limited", 4, timeout=5.0)  # room for the waiting chunk
    w.flush(timeout=5.0)
    info = client.info("limited")
    assert (info.size, info.stored_steps - steps, info.inserts) == (6, 6, 6)
    assert w.items_acknowledged == 6 and w.pending_chunks == 0
    keys = np.concatenate(w.keys)
    assert len(set(keys.tolist())) == 6
    w.close()


# ------------------------------------------------------------ writer ids and lifetimes
def seeded_writer(address: str, tag: int, steps: int, out) -> None:
    """Child: seed ``random`` and numpy like a reproducible actor, then write ``steps``
    steps tagged ``tag`` with one sequence item per step."""
    import random

    random.seed(0)
    np.random.seed(0)
    try:
        client = rlreplay.Client(address)
        with client.trajectory_writer("seq4_lagged", chunk_steps=5) as w:
            for i in range(steps):
                w.append({"obs": np.array([tag, i], np.float32), "reward": np.float32(tag)})
                if i >= 3:
                    w.create_item("seq4_lagged")
            w.flush(timeout=30.0)
        out.put(("ok", tag, w.items_acknowledged))
    except Exception as exc:  # reported to the test
        out.put(("error", tag, f"{type(exc).__name__}: {exc}"))


def unclosed_writer(address: str, steps: int, out) -> None:
    """Child: write ``steps`` steps and items and exit without closing the writer."""
    client = rlreplay.Client(address)
    w = client.trajectory_writer("rows", chunk_steps=64)
    for i in range(steps):
        w.append({"obs": np.array([i, -i], np.float32), "reward": np.float32(i)})
        w.create_item("rows")
    out.put("appended")
    globals()["_kept"] = w  # alive until the interpreter exits


def run_children(target, *args_per_child, timeout: float = 60.0) -> list:
    from netprocs import CTX

    out = CTX.Queue()
    procs = [CTX.Process(target=target, args=(*a, out), daemon=True) for a in args_per_child]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=timeout) for _ in procs]
        for p in procs:
            p.join(timeout)
            assert p.exitcode == 0, p.exitcode
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5.0)


def test_writers_in_identically_seeded_processes_keep_their_own_streams(address):
    client = rlreplay.Client(address)
    client.reset("seq4_lagged")
    steps = 40
    results = run_children(seeded_writer, (address, 1, steps), (address, 2, steps))
    assert sorted(r[:2] for r in results) == [("ok", 1), ("ok", 2)], results
    assert [r[2] for r in results] == [steps - 3, steps - 3]
    size = client.info("seq4_lagged").size
    assert size == 2 * (steps - 3)
    obs = client.sample("seq4_lagged", 400, timeout=5.0).data["obs"]
    tags, idx = obs[:, :, 0], obs[:, :, 1]
    assert (tags == tags[:, :1]).all(), "an item mixes two writers' steps"
    np.testing.assert_array_equal(np.diff(idx, axis=1), 1)  # consecutive steps of one writer


def test_a_writer_left_open_is_flushed_when_its_process_exits(address):
    client = rlreplay.Client(address)
    client.reset("rows")
    assert run_children(unclosed_writer, (address, 10)) == ["appended"]
    info = client.info("rows")
    assert (info.size, info.inserts) == (10, 10)


def test_a_writer_collected_unclosed_warns(address):
    import gc

    client = rlreplay.Client(address)
    w = client.trajectory_writer("rows")
    w.append({"obs": np.zeros(2, np.float32), "reward": np.float32(0)})
    with pytest.warns(ResourceWarning, match="never closed: 1 steps"):
        del w
        gc.collect()


def test_another_writer_filling_the_store_does_not_cut_a_remote_writers_context(chunk_server):
    client, tables = chunk_server
    store = tables["seq"].store
    client.reset("seq")  # only this writer's item, so a sample returns it
    w = client.trajectory_writer(["seq"], history=3, chunk_steps=2, keep_keys=True)
    for i in range(2):
        w.append({"obs": np.array([i, i], np.float32), "reward": np.float32(i)})
    w.flush(timeout=5.0)
    store.append(chunk_steps(500, STORE_STEPS - 2))  # the writer's steps are now the oldest
    w.append({"obs": np.array([2, 2], np.float32), "reward": np.float32(2)})
    w.create_item("seq")  # reaches back to the two retained steps
    w.flush(timeout=5.0)
    assert w.items_acknowledged == 1
    key = int(w.keys[-1][0])
    w.close()
    got = client.sample("seq", 16, timeout=5.0)
    obs = got.data["obs"][got.info.keys == key][0]
    np.testing.assert_array_equal(obs[:, 0], [0, 1, 2])


def test_a_chunk_refused_for_its_items_is_dropped_and_the_stream_goes_on(chunk_server):
    client, tables = chunk_server
    client.reset("rows")  # only this writer's item, so a sample returns it
    w = client.trajectory_writer(["seq", "rows"], history=4, chunk_steps=2, keep_keys=True)
    for i in range(3):
        w.append({"obs": np.array([i, i], np.float32), "reward": np.float32(i)})
    w.flush(timeout=5.0)
    tables["seq"].close()  # the server now refuses items in "seq"
    w.append({"obs": np.array([3, 3], np.float32), "reward": np.float32(3)})
    w.create_item("rows", start=-2)
    w.create_item("seq")
    with pytest.raises(ClosedError, match="dropped, with 2 items"):
        w.flush(timeout=5.0)
    assert w.pending_chunks == 0 and w.items_acknowledged == 0
    with pytest.raises(InvalidArgumentError, match="retained"):
        w.create_item("rows", start=-1)  # the dropped steps are gone for later items too
    for i in range(4, 6):
        w.append({"obs": np.array([i, i], np.float32), "reward": np.float32(i)})
    w.create_item("rows", start=-2)
    w.flush(timeout=5.0)
    assert w.items_acknowledged == 1
    key = int(w.keys[-1][0])
    w.close()
    got = client.sample("rows", 16, timeout=5.0)
    assert got.data["obs"][got.info.keys == key][0, 0] == 4


def forked_flush(writer, out) -> None:
    """Child (forked): the writer copied from the parent refuses to send."""
    try:
        writer.append({"obs": np.zeros(2, np.float32), "reward": np.float32(0)})
        writer.flush(timeout=1.0)
        out.put("sent")
    except ClosedError as exc:
        out.put(f"ClosedError: {exc}")


def test_a_writer_copied_into_a_forked_process_refuses_to_send(address):
    import multiprocessing as mp

    client = rlreplay.Client(address)
    w = client.trajectory_writer("rows")
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=forked_flush, args=(w, out), daemon=True)
    proc.start()
    try:
        assert out.get(timeout=30.0).startswith("ClosedError: this writer was created")
    finally:
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()
    w.close()


def test_a_silent_writer_lets_its_retained_steps_go(chunk_server, monkeypatch):
    import rlreplay.net.server.sessions as sessions

    client, tables = chunk_server
    overwrite = tables["seq"].store.overwrite
    step = {"obs": np.zeros(2, np.float32), "reward": np.float32(0)}
    quiet = client.trajectory_writer(["rows"], history=3)
    for _ in range(2):
        quiet.append(step)
    quiet.flush(timeout=5.0)
    assert sorted(r.count for r in overwrite.retentions()) == [2]
    monkeypatch.setattr(sessions, "WRITER_IDLE_S", 0.5)
    time.sleep(1.1)
    busy = client.trajectory_writer(["rows"], history=3)
    busy.append(step)
    busy.flush(timeout=5.0)  # the server looks for silent writers when chunks arrive
    assert sorted(r.count for r in overwrite.retentions()) == [0, 1]  # the busy one holds 1
    busy.close()
    quiet.close()


def test_writers_that_vanished_cannot_fill_the_store_with_retained_steps(chunk_server):
    client, tables = chunk_server
    store = tables["seq"].store
    for writer in range(20):  # writers that each send one chunk and are never heard again
        write(client, {"writer": writer, "episode_starts": []}, {})
    held = sum(r.count for r in store.overwrite.retentions())
    assert held <= STORE_STEPS // 2 + 4  # half the store, plus the newest writer's steps
    store.append(chunk_steps(0, STORE_STEPS // 2))  # other writers still have room


def test_items_at_one_step_in_tables_four_apart_are_both_created():
    """A chunk's (table, anchor) pairs are told apart for every table index, not only
    the first few (tables 0 and 4 at one anchor are two items, not a repeat)."""
    store = rlreplay.StepStore({"x": "float32"}, capacity=64)
    tables = [rlreplay.Table(f"t{i}", store=store) for i in range(5)]
    with rlreplay.Server(tables) as server, rlreplay.Client(server.address) as client:
        writer = client.trajectory_writer([t.name for t in tables])
        writer.append({"x": 1.0})
        writer.create_item("t0")
        writer.create_item("t4")
        writer.close(timeout=5.0)
    assert [len(t) for t in tables] == [1, 0, 0, 0, 1]
