"""rlreplay.reverb against a server on loopback: inserts, writers, sampling, priorities,
queues and stacks, server_info, pickling, datasets and the errors of each."""

from __future__ import annotations

import collections
import pickle
import socket
import time
from pathlib import Path

import numpy as np
import pytest

import rlreplay.reverb as reverb

Step = collections.namedtuple("Step", ["obs", "action"])
SIG = {
    "obs": reverb.TensorSpec([3, 2], np.float32),
    "extras": (
        reverb.TensorSpec([3], np.int64),
        Step(obs=reverb.TensorSpec([], np.float64), action=reverb.TensorSpec([2], np.uint8)),
    ),
}
TRANSITION = Step(obs=reverb.TensorSpec([4], np.float32), action=reverb.TensorSpec([], np.int64))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tables = [
        reverb.Table(
            "prio",
            reverb.selectors.Prioritized(1.0),
            reverb.selectors.Fifo(),
            100,
            reverb.rate_limiters.MinSize(1),
            signature=reverb.TensorSpec([], np.int64),
        ),
        reverb.Table(
            "nested",
            reverb.selectors.Uniform(),
            reverb.selectors.Fifo(),
            50,
            reverb.rate_limiters.MinSize(1),
            signature=SIG,
        ),
        reverb.Table(
            "transitions",
            reverb.selectors.Uniform(),
            reverb.selectors.Fifo(),
            1000,
            reverb.rate_limiters.MinSize(1),
            signature=TRANSITION,
        ),
        reverb.Table.queue("queue", 5),
        reverb.Table.stack("stack", 5, signature=reverb.TensorSpec([], np.int64)),
        reverb.Table(
            "small",
            reverb.selectors.Fifo(),
            reverb.selectors.Fifo(),
            10,
            reverb.rate_limiters.MinSize(1),
            max_item_bytes=128,
        ),
    ]
    checkpoints = reverb.checkpointers.DefaultCheckpointer(tmp_path_factory.mktemp("ckpt"))
    srv = reverb.Server(tables, checkpointer=checkpoints)
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    c = server.localhost_client()
    yield c
    for table in c.server_info():  # every table emptied after each test
        c.reset(table)


def sizes(client):
    return {name: info.current_size for name, info in client.server_info(timeout=10).items()}


def test_server_serves_on_loopback_and_hides_its_description_table(server, client):
    assert reverb.Client(f"localhost:{server.port}").server_address.endswith(str(server.port))
    assert set(sizes(client)) == {"prio", "nested", "transitions", "queue", "stack", "small"}


def test_insert_then_sample_timesteps_with_info(client):
    for i in range(4):
        client.insert(i, {"prio": 1.0 + i})
    [step] = next(client.sample("prio", 1))
    assert step.info.table_size == 4 and isinstance(step.info.key, int)
    assert step.info.probability == pytest.approx(step.info.priority / 10.0)
    assert step.info.times_sampled == 1
    assert step.data[0].dtype == np.int64 and step.data[0].shape == ()
    whole = next(client.sample("prio", 1, emit_timesteps=False))
    assert whole.data[0].shape == (1,)  # one timestep, kept as a trajectory of length 1


def test_insert_into_several_tables_and_refusals(client):
    client.insert(np.int64(7), {"prio": 1.0, "stack": 1.0})
    assert sizes(client)["prio"] == 1 and sizes(client)["stack"] == 1
    with pytest.raises(ValueError, match="priorities"):
        client.insert(1, {})
    with pytest.raises(reverb.errors.SignatureError, match="dtype float"):
        client.insert(np.float32(1), {"prio": 1.0})
    with pytest.raises(ValueError, match="Could not find table"):
        client.insert(1, {"nope": 1.0})
    with pytest.raises(ValueError, match="max_item_bytes=128"):
        client.insert(np.zeros(100), {"small": 1.0})


def test_trajectory_writer_items_unpack_as_the_signature(client):
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        for t in range(4):
            writer.append(
                {
                    "obs": np.full(2, t, np.float32),
                    "id": np.int64(t),
                    "step": Step(obs=float(t), action=np.array([t, t], np.uint8)),
                }
            )
        h = writer.history
        assert writer.episode_steps == 4 and isinstance(h["step"], Step)
        writer.create_item(
            "nested",
            1.0,
            {
                "obs": h["obs"][-3:],
                "extras": (h["id"][-3:], Step(obs=h["step"].obs[-1], action=h["step"].action[-2])),
            },
        )
        with pytest.raises(ValueError, match="None"):
            h["obs"][0]  # older than num_keep_alive_refs
    sample = next(client.sample("nested", emit_timesteps=False, unpack_as_table_signature=True))
    np.testing.assert_array_equal(sample.data["obs"], [[1, 1], [2, 2], [3, 3]])
    ids, step = sample.data["extras"]
    np.testing.assert_array_equal(ids, [1, 2, 3])
    assert isinstance(step, Step) and step.obs == 3.0 and list(step.action) == [2, 2]
    flat = next(client.sample("nested", emit_timesteps=False))
    assert [c.shape for c in flat.data] == [(3,), (), (2,), (3, 2)]  # sorted keys
    with pytest.raises(ValueError, match="timestep"):
        next(client.sample("nested"))  # columns of different lengths


def test_trajectory_writer_checks_columns_and_items(client):
    writer = client.trajectory_writer(2)
    writer.append({"a": 1, "b": np.zeros(2)})
    with pytest.raises(ValueError, match=r"wrong dtype provided for column \('a',\)"):
        writer.append({"a": 1.0, "b": np.zeros(2)})
    with pytest.raises(ValueError, match=r"Got \[3\] which is incompatible with \[2\]"):
        writer.append({"a": 1, "b": np.zeros(3)})
    with pytest.raises(TypeError, match="TrajectoryColumn"):
        writer.create_item("prio", 1.0, {"a": np.zeros(1)})
    with pytest.raises(reverb.errors.SignatureError, match="incompatible"):
        writer.create_item("prio", 1.0, writer.history["a"][-1:])
    with pytest.raises(ValueError):
        client.trajectory_writer(0)
    writer.append({"a": 2}, partial_step=True)
    writer.append({"b": np.ones(2)})
    with pytest.raises(ValueError, match="already been set"):
        writer.append({"a": 3}, partial_step=True)
        writer.append({"a": 4})
    writer.close()


def test_legacy_writer_items_span_timesteps(client):
    with client.writer(3) as writer:
        for i in range(3):
            writer.append([np.int64(i), np.ones([2, 2])])
        writer.create_item("queue", 3, 1.0)
        writer.append_sequence([np.array([5, 6]), np.zeros([2, 2, 2])])
        writer.create_item("queue", 2, 1.0)
        with pytest.raises(ValueError, match="num_timesteps"):
            writer.create_item("queue", 4, 1.0)
    first, second = client.sample("queue", 2)
    assert [s.data[0] for s in first] == [0, 1, 2] and len(second) == 2
    with pytest.raises(ValueError, match="already"):
        writer.close()
    for bad in (
        {"max_sequence_length": 0},
        {"max_sequence_length": 2, "chunk_length": 3},
        {"max_sequence_length": 2, "max_in_flight_items": 0},
    ):
        with pytest.raises(ValueError):
            client.writer(**bad)


def test_queue_is_fifo_and_stack_is_lifo_each_item_once(client):
    for i in range(4):
        client.insert(np.int64(i), {"queue": 1.0, "stack": 1.0})
    queued = [s[0].data[0] for s in client.sample("queue", 4)]
    stacked = [s[0].data[0] for s in client.sample("stack", 4)]
    assert queued == [0, 1, 2, 3] and stacked == [3, 2, 1, 0]
    assert sizes(client)["queue"] == 0 and sizes(client)["stack"] == 0


def test_mutate_priorities_updates_then_deletes(client):
    for i in range(3):
        client.insert(i, {"prio": 1.0})
    keys = {s[0].data[0].item(): s[0].info.key for s in client.sample("prio", 200)}
    assert len(keys) == 3
    client.mutate_priorities("prio", updates={keys[0]: 0.0, keys[1]: 3.0}, deletes=[keys[2]])
    seen = {s[0].data[0].item(): s[0].info.priority for s in client.sample("prio", 50)}
    assert seen == {1: 3.0}
    client.mutate_priorities("prio", deletes=[keys[2]])  # gone already: ignored
    for bad in ([-1], [1.5], [2**64]):
        with pytest.raises(ValueError, match="keys"):
            client.mutate_priorities("prio", deletes=bad)
    with pytest.raises(ValueError, match="priority='high' for table 'prio' must be a finite"):
        client.mutate_priorities("prio", updates={keys[1]: "high"})


def test_reset_gives_new_keys(client):
    client.insert(1, {"prio": 1.0})
    before = next(client.sample("prio"))[0].info.key
    client.reset("prio")
    client.insert(1, {"prio": 1.0})
    assert next(client.sample("prio"))[0].info.key != before


def test_server_info_describes_every_table(client):
    client.insert(1, {"prio": 1.0})
    info = client.server_info()
    assert info["prio"].current_size == 1 and info["prio"].max_size == 100
    assert info["prio"].sampler_options.prioritized.priority_exponent == 1.0
    assert info["queue"].sampler_options.fifo and info["queue"].max_times_sampled == 1
    assert info["nested"].signature == SIG and info["queue"].signature is None
    assert type(info["transitions"].signature) is Step


def test_num_unique_samples_counts_items_sampled_since_the_reset(client):
    client.insert(1, {"prio": 1.0})
    client.insert(2, {"prio": 1.0})
    assert client.server_info()["prio"].num_unique_samples == 0
    keys = {s[0].info.key for s in client.sample("prio", num_samples=20)}
    assert client.server_info()["prio"].num_unique_samples == len(keys) == 2
    client.reset("prio")
    assert client.server_info()["prio"].num_unique_samples == 0


def test_server_info_of_no_server_raises_deadline_exceeded():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(reverb.errors.DeadlineExceededError, match=r"timeout of 0\.5s"):
        reverb.Client(f"localhost:{port}").server_info(timeout=0.5)
    assert time.monotonic() - start < 10


def test_clients_pickle_as_their_address(server, client):
    loaded = pickle.loads(pickle.dumps(client))
    assert loaded.server_address == client.server_address and loaded._server_address
    loaded.insert(1, {"prio": 1.0})
    assert sizes(client)["prio"] == 1


def test_flush_timeout_on_a_full_queue_raises_deadline_exceeded(client):
    writer = client.trajectory_writer(1)
    for i in range(6):  # one more than the queue holds: the limiter holds the last
        writer.append({"x": np.int64(i)})
        writer.create_item("queue", 1.0, writer.history["x"][-1])
    with pytest.raises(reverb.errors.DeadlineExceededError, match="Flush call did not complete"):
        writer.flush(timeout_ms=300)
    first = next(client.sample("queue", emit_timesteps=False))
    assert first.data[0] == 0
    writer.flush(timeout_ms=5000)  # room again: the held item goes in
    assert sizes(client)["queue"] == 5


def test_trajectory_dataset_batches_from_the_table_signature(server, client):
    with client.trajectory_writer(2) as writer:
        for t in range(20):
            writer.append(Step(obs=np.full(4, t, np.float32), action=np.int64(t)))
            writer.create_item(
                "transitions",
                1.0 + t,
                Step(obs=writer.history.obs[-1], action=writer.history.action[-1]),
            )
    ds = reverb.TrajectoryDataset.from_table_signature(
        f"localhost:{server.port}", "transitions", max_in_flight_samples_per_worker=16
    )
    batches = list(ds.batch(8).take(3).as_numpy_iterator())
    assert len(batches) == 3
    info, data = batches[0]
    assert isinstance(data, Step) and data.obs.shape == (8, 4) and data.action.shape == (8,)
    np.testing.assert_array_equal(data.obs[:, 0], data.action)
    assert info.key.dtype == np.uint64 and info.table_size.tolist() == [20] * 8
    client.mutate_priorities("transitions", updates=dict.fromkeys(info.key.tolist(), 0.5))
    single = next(
        iter(
            reverb.TrajectoryDataset(
                client,
                "transitions",
                dtypes=Step(np.float32, np.int64),
                shapes=Step((4,), ()),
                max_in_flight_samples_per_worker=4,
            )
        )
    )
    assert single.data.obs.shape == (4,) and isinstance(single.info.key, int)
    with pytest.raises(ValueError, match="holds"):
        reverb.TrajectoryDataset(
            client,
            "transitions",
            dtypes=Step(np.float64, np.int64),
            shapes=Step((4,), ()),
            max_in_flight_samples_per_worker=4,
        )


def test_dataset_ends_at_a_rate_limiter_timeout_and_at_max_samples(client):
    for i in range(3):
        client.insert(np.int64(i), {"stack": 1.0})
    ds = reverb.TrajectoryDataset(
        client,
        "stack",
        dtypes=np.int64,
        shapes=(),
        max_in_flight_samples_per_worker=2,
        rate_limiter_timeout_ms=200,
    )
    assert sorted(int(s.data) for s in ds) == [0, 1, 2]  # then the stack is empty: the end
    for i in range(3):
        client.insert(np.int64(i), {"prio": 1.0})
    ds = reverb.TimestepDataset(
        client,
        "prio",
        dtypes=np.int64,
        shapes=(),
        max_in_flight_samples_per_worker=2,
        max_samples=5,
    )
    assert len(list(ds)) == 5


def test_checkpoint_returns_its_directory(server, client):
    client.insert(1, {"prio": 1.0})
    path = client.checkpoint()
    assert isinstance(path, str) and Path(path).is_dir() and "ckpt" in path


def test_writer_sends_items_in_batches_and_all_at_flush(server, client):
    writer = client.trajectory_writer(1)
    writer.SEND_AFTER_S = 60.0  # only the count (64) or a flush sends here
    for t in range(70):
        writer.append(Step(obs=np.full(4, t, np.float32), action=np.int64(t)))
        writer.create_item(
            "transitions", 1.0, Step(obs=writer.history.obs[-1], action=writer.history.action[-1])
        )
    rr_table = server._tables[2].rlreplay_table
    assert rr_table.name == "transitions" and writer._pending["transitions"].n == 6
    writer.flush()
    assert len(rr_table) == 70 and not writer._pending
    data = rr_table.sample(70).data
    np.testing.assert_array_equal(data["c0"][:, 0], data["c1"])  # obs and action of one step
    writer.close()


def test_items_for_a_ratio_limited_table_go_in_batches_the_limiter_admits(tmp_path):
    table = reverb.Table(
        "ratio",
        reverb.selectors.Fifo(),
        reverb.selectors.Fifo(),
        100,
        reverb.rate_limiters.SampleToInsertRatio(1.0, 2, 6.0),
        signature=reverb.TensorSpec([], np.int64),
    )
    with reverb.Server(
        [table], checkpointer=reverb.checkpointers.DefaultCheckpointer(tmp_path)
    ) as srv:
        client = srv.localhost_client()
        meta = client._table("ratio")
        assert meta.insert_batch == 6  # half of the limiter's range of 12
        with client.trajectory_writer(1) as writer:
            for t in range(8):  # inserts stop at max_diff 8 without samples
                writer.append({"x": np.int64(t)})
                writer.create_item("ratio", 1.0, writer.history["x"][-1])
            writer.flush(timeout_ms=5000)
        assert table.info.current_size == 8
        samples = client.sample("ratio", 3, emit_timesteps=False)
        assert [int(s.data[0]) for s in samples] == [0, 0, 0]  # Fifo: the oldest, each time


def test_a_column_first_given_in_an_open_step_reads_none_before_it(client):
    writer = client.trajectory_writer(4)
    writer.append({"a": np.int64(0)})
    writer.append({"a": np.int64(1)}, partial_step=True)
    writer.append({"b": np.float32(2)}, partial_step=True)  # a new column, in the open step
    writer.append({})
    assert [ref is None for ref in writer.history["b"]] == [True, False]
    assert writer.episode_steps == 2 and writer.history["b"][-1].numpy() == 2.0
    with pytest.raises(ValueError, match="None"):
        writer.history["b"][0]


def test_an_unsigned_table_mixes_items_of_any_structure(client):
    items = [np.ones([], np.int64), {"x": np.ones([2, 2], np.float32)}, [np.zeros(3, np.int32)]]
    for item in items:
        client.insert(item, {"queue": 1.0})
    got = [s.data for s in client.sample("queue", 3, emit_timesteps=False)]
    assert [[c.shape for c in g] for g in got] == [[(1,)], [(1, 2, 2)], [(1, 3)]]
    assert [g[0].dtype for g in got] == [np.int64, np.float32, np.int32]


def test_timestep_dataset_yields_each_step_of_legacy_items(client):
    with client.writer(3) as writer:
        for i in range(3):
            writer.append(np.int64(i))
        writer.create_item("queue", 3, 1.0)
    ds = reverb.TimestepDataset(
        client,
        "queue",
        dtypes=np.int64,
        shapes=(),
        max_in_flight_samples_per_worker=1,
        max_samples=1,
    )
    assert [int(s.data) for s in ds] == [0, 1, 2]


def test_dataset_gives_torch_tensors_where_torch_is_installed(client):
    torch = pytest.importorskip("torch")
    for i in range(4):
        client.insert(i, {"prio": 1.0})
    ds = reverb.TrajectoryDataset(
        client, "prio", dtypes=np.int64, shapes=(), max_in_flight_samples_per_worker=4
    )
    sample = next(ds.batch(4).as_iterator(output="torch"))
    assert isinstance(sample.data, torch.Tensor) and sample.data.shape == (4,)
    with pytest.raises(ValueError, match="output"):
        next(ds.as_iterator(output="tensorflow"))


def test_writers_copy_what_they_are_given(client):
    buffer = np.zeros(4, np.float32)
    with client.trajectory_writer(2) as writer:
        for t in range(2):
            buffer[:] = t  # an environment that reuses its observation array
            writer.append(Step(obs=buffer, action=np.int64(t)))
        h = writer.history
        writer.create_item("transitions", 1.0, Step(obs=h.obs[-2], action=h.action[-2]))
    with client.writer(1) as legacy:
        buffer[:] = 7
        legacy.append(Step(obs=buffer, action=np.int64(7)))
        buffer[:] = 8
        legacy.create_item("queue", 1, 1.0)
    item = next(client.sample("transitions", emit_timesteps=False, unpack_as_table_signature=True))
    assert item.data.obs.tolist() == [0, 0, 0, 0] and item.data.action == 0
    [step] = next(client.sample("queue"))
    assert step.data[0].tolist() == [7, 7, 7, 7]  # [obs, action], in field order


def test_an_abandoned_sample_generator_draws_few_items_ahead(client):
    for i in range(4):
        client.insert(i, {"prio": 1.0})
    samples = client.sample("prio", 1000)
    for _ in range(3):
        next(samples)
    samples.close()
    assert client.server_info()["prio"].rate_limiter_info.sample_stats.completed <= 6


@pytest.mark.parametrize("remover", ["Fifo", "Lifo", "MinHeap"])
def test_full_tables_keep_taking_items_from_every_writer(tmp_path, remover):
    table = reverb.Table(
        "t",
        reverb.selectors.Uniform(),
        getattr(reverb.selectors, remover)(),
        10,
        reverb.rate_limiters.MinSize(1),
        signature=reverb.TensorSpec([], np.int64),
    )
    with reverb.Server(
        [table], checkpointer=reverb.checkpointers.DefaultCheckpointer(tmp_path)
    ) as srv:
        client = srv.localhost_client()
        for i in range(50):  # single rows, coalesced by the client
            client._insert_item("t", [np.array(np.int64(i))], 1.0, False)
        with client.trajectory_writer(1) as writer:  # batches of up to max_size items
            for i in range(50, 120):
                writer.append({"x": np.int64(i)})
                writer.create_item("t", float(i), writer.history["x"][-1])
        with client.writer(1) as legacy:
            for i in range(120, 135):
                legacy.append(np.int64(i))
                legacy.create_item("t", 1, 1.0)
        assert table.info.current_size == 10
        samples = client.sample("t", 200, emit_timesteps=False)
        held = {int(s.data[0].reshape(-1)[0]) for s in samples}  # shapes () and (1,)
        if remover == "Fifo":
            assert held == set(range(125, 135))


def test_a_server_without_checkpointer_removes_its_empty_temporary_directory(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # where mkdtemp makes it
    table = reverb.Table.queue("q", 4, signature=reverb.TensorSpec([], np.int64))
    with reverb.Server([table]):
        (made,) = tmp_path.glob("rlreplay_reverb_checkpoints_*")
    assert not made.exists()  # no checkpoint was written: nothing is left behind

    table = reverb.Table.queue("q", 4, signature=reverb.TensorSpec([], np.int64))
    with reverb.Server([table]) as srv:
        srv.localhost_client().insert(np.int64(1), {"q": 1.0})
        saved = Path(srv.localhost_client().checkpoint())
    assert saved.exists() and saved.parent.name.startswith("rlreplay_reverb_checkpoints_")
    table = reverb.Table.queue("q", 4, signature=reverb.TensorSpec([], np.int64))
    checkpointer = reverb.checkpointers.DefaultCheckpointer(saved.parent)
    with reverb.Server([table], checkpointer=checkpointer):  # the checkpoint stays, to restore
        assert table.info.current_size == 1
