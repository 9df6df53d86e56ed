"""rlreplay.reverb's writers and datasets against a server on loopback, with the mistakes
a user makes: items a table cannot take, writers used after close or dropped unclosed,
bad priorities and arguments, and datasets whose dtypes do not describe the items. Each
is refused where it is made, by a Reverb-named error, and nothing stored changes."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import rlreplay.reverb as reverb

VEC = reverb.TensorSpec([3], np.float32)


@pytest.fixture(scope="module")
def server():
    def table(name, **kwargs):
        return reverb.Table(
            name,
            reverb.selectors.Uniform(),
            reverb.selectors.Fifo(),
            100,
            reverb.rate_limiters.MinSize(1),
            **kwargs,
        )

    srv = reverb.Server(
        [
            table("plain", max_item_bytes=1024),
            table("vec", signature={"obs": VEC}),
            table("scalar", signature={"obs": reverb.TensorSpec([], np.float32)}),
        ]
    )
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    c = server.localhost_client()
    yield c
    for table in c.server_info():  # every table emptied after each test
        c.reset(table)


def size(client, table):
    return client.server_info()[table].current_size


def test_an_item_too_large_for_its_row_is_refused_when_created_and_the_rest_go_in(client):
    with client.trajectory_writer(1) as writer:
        writer.append({"x": np.zeros(3, np.float32)})
        writer.create_item("plain", 1.0, {"x": writer.history["x"][-1]})
        writer.append({"big": np.zeros((100, 100), np.float32)})
        with pytest.raises(reverb.errors.InvalidArgumentError, match="max_item_bytes=1024"):
            writer.create_item("plain", 1.0, {"big": writer.history["big"][-1]})
        writer.append({"x": np.ones(3, np.float32)})
        writer.create_item("plain", 1.0, {"x": writer.history["x"][-1]})
    assert size(client, "plain") == 2


CLOSED_CALLS = {
    "append": lambda w: w.append({"obs": np.zeros(3, np.float32)}),
    "create_item": lambda w: w.create_item("vec", 1.0, {"obs": w.history["obs"][-1]}),
    "flush": lambda w: w.flush(),
    "end_episode": lambda w: w.end_episode(),
}


@pytest.mark.parametrize("call", CLOSED_CALLS.values(), ids=CLOSED_CALLS.keys())
def test_a_closed_trajectory_writer_refuses_every_call(client, call):
    writer = client.trajectory_writer(1)
    writer.append({"obs": np.zeros(3, np.float32)})
    writer.close()
    with pytest.raises(reverb.errors.ClosedError, match="after Close") as info:
        call(writer)
    assert isinstance(info.value, RuntimeError)
    assert size(client, "vec") == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda w: w.append(np.float32(1)),
        lambda w: w.append_sequence(np.zeros(2, np.float32)),
        lambda w: w.create_item("plain", 1, 1.0),
    ],
    ids=["append", "append_sequence", "create_item"],
)
def test_a_closed_legacy_writer_refuses_every_call(client, call):
    writer = client.writer(2)
    writer.append(np.float32(1))
    writer.close()
    with pytest.raises(reverb.errors.ClosedError, match="after Close"):
        call(writer)
    assert size(client, "plain") == 0


def test_a_writer_closed_inside_its_with_block_leaves_it_quietly(client):
    with client.trajectory_writer(1) as writer:
        writer.append({"obs": np.zeros(3, np.float32)})
        writer.create_item("vec", 1.0, {"obs": writer.history["obs"][-1]})
        writer.close()
    assert size(client, "vec") == 1


def test_a_trajectory_writer_dropped_without_close_sends_what_it_held(client):
    def actor():
        writer = client.trajectory_writer(1)
        for i in range(5):
            writer.append({"obs": np.full(3, i, np.float32)})
            writer.create_item("vec", 1.0, {"obs": writer.history["obs"][-1]})

    actor()
    gc.collect()
    assert size(client, "vec") == 5


@pytest.mark.parametrize(("table", "shape"), [("vec", (3,)), ("scalar", ())])
def test_a_timestep_dataset_takes_an_item_of_single_cells_as_one_timestep(client, table, shape):
    with client.trajectory_writer(1) as writer:
        for i in range(3):
            writer.append({"obs": np.full(shape, i, np.float32)})
            writer.create_item(table, 1.0, {"obs": writer.history["obs"][-1]})
    dataset = reverb.TimestepDataset.from_table_signature(client, table, 4, max_samples=3)
    samples = list(dataset)
    assert [s.data["obs"].shape for s in samples] == [shape] * 3
    assert all(0 <= np.ravel(s.data["obs"])[0] <= 2 for s in samples)
    client.insert({"obs": np.ones(shape, np.float32)}, {table: 1.0})  # a timestep item
    batches = reverb.TimestepDataset.from_table_signature(client, table, 4).batch(4).take(2)
    assert [b.data["obs"].shape for b in batches] == [(4, *shape)] * 2


def test_a_timestep_dataset_refuses_single_cells_its_dtypes_do_not_describe(client):
    with client.trajectory_writer(1) as writer:
        writer.append({"obs": np.zeros(3, np.float64)})
        writer.create_item("plain", 1.0, {"obs": writer.history["obs"][-1]})
    dataset = reverb.TimestepDataset(
        client, "plain", {"obs": np.float32}, {"obs": [3]}, rate_limiter_timeout_ms=500
    )
    with pytest.raises(reverb.errors.InvalidArgumentError, match=r"float64\[3\].*float32\[3\]"):
        list(dataset.take(1))


def test_a_dataset_over_an_unsigned_table_refuses_items_its_dtypes_do_not_describe(client):
    client.insert(np.float32(1), {"plain": 1.0})
    dataset = reverb.TrajectoryDataset(
        client, "plain", dtypes=np.int64, shapes=[7, 3], rate_limiter_timeout_ms=500
    )
    with pytest.raises(reverb.errors.InvalidArgumentError, match=r"float32\[1\].*int64\[7, 3\]"):
        list(dataset.take(1))
    described = reverb.TrajectoryDataset(
        client, "plain", dtypes=np.float32, shapes=[1], rate_limiter_timeout_ms=500
    )
    assert [s.data.shape for s in described.take(1)] == [(1,)]


def test_a_batch_of_unsigned_items_of_different_shapes_is_refused_by_name(client):
    client.insert(np.zeros(2, np.float32), {"plain": 1.0})
    client.insert(np.zeros(3, np.float32), {"plain": 1.0})
    dataset = reverb.TrajectoryDataset(
        client, "plain", dtypes=None, shapes=None, rate_limiter_timeout_ms=500
    ).batch(8)
    with pytest.raises(reverb.errors.InvalidArgumentError, match="differ in shape"):
        list(dataset.take(1))


BAD_PRIORITIES = [None, "1", True, -1.0, float("nan"), float("inf")]
PRIORITY_CALLS = {
    "trajectory_writer": lambda c, p: _trajectory_item(c, p),
    "legacy_writer": lambda c, p: _legacy_item(c, p),
    "insert": lambda c, p: c.insert({"obs": np.zeros(3, np.float32)}, {"vec": p}),
}


def _trajectory_item(client, priority):
    with client.trajectory_writer(1) as writer:
        writer.append({"obs": np.zeros(3, np.float32)})
        writer.create_item("vec", priority, {"obs": writer.history["obs"][-1]})


def _legacy_item(client, priority):
    with client.writer(1) as writer:
        writer.append({"obs": np.zeros(3, np.float32)})
        writer.create_item("vec", 1, priority)


@pytest.mark.parametrize("priority", BAD_PRIORITIES, ids=repr)
@pytest.mark.parametrize("call", PRIORITY_CALLS.values(), ids=PRIORITY_CALLS.keys())
def test_a_priority_that_is_not_a_finite_number_is_refused_and_nothing_stored(
    client, call, priority
):
    with pytest.raises(reverb.errors.InvalidArgumentError, match=r"priority=.* for table 'vec'"):
        call(client, priority)
    assert size(client, "vec") == 0


@pytest.mark.parametrize("priority", [2, np.float32(2), np.int64(2), np.array(2.0)], ids=repr)
@pytest.mark.parametrize("call", PRIORITY_CALLS.values(), ids=PRIORITY_CALLS.keys())
def test_a_priority_of_any_numeric_type_goes_in(client, call, priority):
    call(client, priority)
    info = next(client.sample("vec", 1, emit_timesteps=False)).info
    assert info.priority == 2.0
    client.mutate_priorities("vec", updates={info.key: 1.0})
    client.mutate_priorities("vec", updates={info.key: priority})
    assert next(client.sample("vec", 1, emit_timesteps=False)).info.priority == 2.0


@pytest.mark.parametrize("priority", BAD_PRIORITIES, ids=repr)
def test_mutate_priorities_refuses_a_bad_priority_and_changes_nothing(client, priority):
    client.insert({"obs": np.zeros(3, np.float32)}, {"vec": 2.0})
    key = next(client.sample("vec", 1, emit_timesteps=False)).info.key
    with pytest.raises(reverb.errors.InvalidArgumentError, match=r"priority=.* for table 'vec'"):
        client.mutate_priorities("vec", updates={key: 5.0, int(key) + 1: priority})
    assert next(client.sample("vec", 1, emit_timesteps=False)).info.priority == 2.0


ARGUMENT_MISTAKES = [
    (lambda c: c.insert(np.float32(1), [1.0]), "must be a dict of table name to priority"),
    (lambda c: c.trajectory_writer(1).flush(timeout_ms="5"), r"timeout_ms='5' must be an int"),
    (lambda c: c.mutate_priorities("nope"), 'Could not find table "nope"'),
    (lambda c: c.reset("nope"), 'Could not find table "nope"'),
    (lambda c: c.writer(2).create_item("plain", "1", 1.0), r"num_timesteps \('1'\)"),
]


@pytest.mark.parametrize(
    ("call", "said"),
    ARGUMENT_MISTAKES,
    ids=["insert-list", "flush-timeout", "mutate-table", "reset-table", "num_timesteps-str"],
)
def test_argument_mistakes_are_named_by_reverbs_error(client, call, said):
    with pytest.raises(reverb.errors.InvalidArgumentError, match=said) as info:
        call(client)
    assert "__reverb" not in str(info.value)


def test_errors_of_the_reverb_layer_carry_reverbs_names(client):
    with pytest.raises(reverb.errors.InvalidArgumentError, match="Could not find table"):
        next(client.sample("nope", 1))
    writer = client.trajectory_writer(1)
    writer.append({"obs": np.zeros(3, np.float32)})
    with pytest.raises(reverb.errors.InvalidArgumentError, match="wrong dtype"):
        writer.append({"obs": np.zeros(3, np.int64)})
    with pytest.raises(reverb.errors.InvalidArgumentError, match="Could not find table"):
        writer.create_item("nope", 1.0, {"obs": writer.history["obs"][-1]})
    writer.close()
    with pytest.raises(reverb.errors.InvalidArgumentError, match=r"max_size \('10'\)"):
        fifo = reverb.selectors.Fifo()
        reverb.Table("t", fifo, fifo, "10", reverb.rate_limiters.MinSize(1))


def test_a_dropped_writer_whose_items_a_limiter_holds_back_never_waits_for_them():
    limited = reverb.Table(
        "limited",
        reverb.selectors.Uniform(),
        reverb.selectors.Fifo(),
        100,
        reverb.rate_limiters.SampleToInsertRatio(1.0, 1, 2.0),
        signature={"obs": VEC},
    )
    server = reverb.Server([limited])
    try:
        client = server.localhost_client()

        def actor():
            writer = client.trajectory_writer(1)
            for i in range(20):  # nobody samples: the limiter holds most of them back
                writer.append({"obs": np.full(3, i, np.float32)})
                writer.create_item("limited", 1.0, {"obs": writer.history["obs"][-1]})

        start = time.monotonic()
        actor()  # the writer is collected at its return, or by the collection below
        gc.collect()
        assert time.monotonic() - start < 10.0  # offers, not close()'s wait of call_timeout
        assert 1 <= client.server_info()["limited"].current_size < 20
    finally:
        server.stop()


COUNTS = {
    "MinSize": lambda n: reverb.rate_limiters.MinSize(n),
    "SampleToInsertRatio": lambda n: reverb.rate_limiters.SampleToInsertRatio(1.0, n, 2.0),
    "Queue": lambda n: reverb.rate_limiters.Queue(n),
}


@pytest.mark.parametrize("make", COUNTS.values(), ids=COUNTS.keys())
def test_a_numpy_integer_count_makes_the_same_limiter_a_served_table_describes(make):
    limiter = make(np.int64(2))
    assert limiter.info() == make(2).info()
    srv = reverb.Server(
        [reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10, limiter)]
    )
    try:
        assert srv.localhost_client().server_info()["t"].max_size == 10
    finally:
        srv.stop()


def test_a_numpy_integer_min_size_gets_the_deadlock_check_of_an_int():
    with pytest.raises(reverb.errors.InvalidArgumentError, match="deadlock"):
        reverb.rate_limiters.SampleToInsertRatio(1.0, np.int64(10), (50.0, 60.0))
