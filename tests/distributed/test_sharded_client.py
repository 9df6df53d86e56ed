"""ShardedClient against real shard processes: the batch, its probabilities and its
importance weights equal one big table's; keys route to their shard; writers stay on one
shard; the learner's iterator keeps every shard busy."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from shardprocs import CTX, insert_through, shards, table

from rlreplay import Prioritized, Table, Uniform
from rlreplay.distributed import ShardedClient
from rlreplay.errors import ClosedError, InvalidArgumentError, RateLimiterTimeoutError
from rlreplay.net import Server

scipy_stats = pytest.importorskip("scipy.stats")

NUM_SHARDS = 3
ALPHA = 0.7
CONFIGS = [
    {
        "table": [
            table("prio", sampler={"type": "Prioritized", "priority_exponent": ALPHA}, seed=s),
            table("uni", seed=s),
            table("fifo", sampler={"type": "Fifo"}, seed=s),
            table("held", rate_limiter={"type": "MinSize", "min_size_to_sample": 5}, seed=s),
            table("ratio", sampler={"type": "Prioritized", "priority_exponent": 1.0}, seed=s,
                  rate_limiter={"type": "SampleToInsertRatio", "samples_per_insert": 1.0,
                                "min_size_to_sample": 1, "error_buffer": 10.0}),
            table("seq", layout={"type": "transition", "n_step": 1, "next_fields": ["obs"]},
                  seed=s),
        ]
    }
    for s in range(NUM_SHARDS)
]


@pytest.fixture(scope="module")
def addresses():
    with shards(CONFIGS) as started:
        yield [address for address, _ in started]


@pytest.fixture
def client(addresses):
    c = ShardedClient(addresses, seed=1, first_shard=0, call_timeout=20.0)
    for name in ("prio", "uni", "fifo", "seq", "held", "ratio"):
        c.reset(name)
    yield c
    c.close()


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    x = np.arange(first, first + n)
    return {"x": x, "obs": np.stack([x, x], 1).astype(np.float32)}


def fill(client: ShardedClient, name: str, calls: list[int], prio=None) -> np.ndarray:
    """Insert rows ``0..sum(calls)`` in calls of the given sizes (x = row id; priority
    ``prio(x)``); returns the keys in row order."""
    keys, first = [], 0
    for n in calls:
        x = np.arange(first, first + n)
        keys.append(client.insert(name, rows(first, n), None if prio is None else prio(x)))
        first += n
    return np.concatenate(keys)


def one_big_table(name: str, sampler, prio=None, n: int = 0) -> Table:
    big = Table(name, signature={"x": "int64", "obs": ((2,), "float32")}, max_size=1000,
                sampler=sampler, seed=0)
    x = np.arange(n)
    big.insert(rows(0, n), None if prio is None else prio(x))
    return big


def prio_of(x: np.ndarray) -> np.ndarray:
    return 0.5 + (x % 7) * 1.3 + (x % 3)


CASES = {
    "prioritized": ("prio", Prioritized(ALPHA), prio_of),
    "uniform": ("uni", Uniform(), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_probabilities_and_weights_equal_one_big_tables(client, case):
    name, sampler, prio = CASES[case]
    keys = fill(client, name, [7, 13, 4, 9, 11, 6], prio)  # shards of 18, 19 and 13 items
    assert np.bincount(client.shard_of(keys)).tolist() == [18, 19, 13]
    big = one_big_table(name, sampler, prio, 50)
    probs = big.index.sampler.probabilities(np.arange(50)) if prio else np.full(50, 1 / 50)
    batch = client.sample(name, 300, timeout=5.0)
    x = batch.data["x"]
    np.testing.assert_array_equal(batch.data["obs"][:, 0], x)  # rows intact
    np.testing.assert_allclose(batch.info.probabilities, probs[x], rtol=1e-6, atol=0)
    assert batch.info.table_size == 50
    ref = big.sample(8)
    assert batch.info.min_probability == pytest.approx(ref.info.min_probability, rel=1e-6)
    w = (50 * probs[x]) ** -0.4
    for normalize, expected in (("none", w), ("batch", w / w.max()),
                                ("table", w / (50 * probs.min()) ** -0.4)):
        got = batch.importance_weights(0.4, normalize)
        np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sampling_distribution_passes_chi_square_against_one_big_table(client, case):
    name, sampler, prio = CASES[case]
    keys = fill(client, name, [5, 11, 8, 6, 10], prio)  # shards of 21, 11 and 8 items
    big = one_big_table(name, sampler, prio, 40)
    expected = big.index.sampler.probabilities(np.arange(40)) if prio else np.full(40, 1 / 40)
    counts = np.zeros(40)
    with client.sample_iterator(name, 500, in_flight=3, timeout=5.0) as it:
        for _ in range(40):
            counts += np.bincount(next(it).data["x"], minlength=40)
    draws = counts.sum()
    assert draws == 20_000
    assert scipy_stats.chisquare(counts, expected * draws).pvalue > 1e-3
    big_counts = sum(np.bincount(big.sample(500).data["x"], minlength=40) for _ in range(40))
    assert scipy_stats.chi2_contingency([counts, big_counts]).pvalue > 1e-3
    # The test has the power to reject the per-shard draw (each shard an equal share of
    # the batch, weights normalised within it) that this client replaces.
    shard = client.shard_of(keys)
    per_shard = np.zeros(40)
    for s in range(NUM_SHARDS):
        mine = shard == s
        per_shard[mine] = expected[mine] / expected[mine].sum() / NUM_SHARDS
    assert scipy_stats.chisquare(counts, per_shard * draws).pvalue < 1e-6


def test_keys_carry_their_shard_and_route_updates_and_deletes(client):
    keys = fill(client, "prio", [10, 10, 10], lambda x: np.ones(len(x)))
    assert np.bincount(client.shard_of(keys)).tolist() == [10, 10, 10]
    assert len(np.unique(keys)) == 30
    # x = 0..9 on shard 0: raise their priority; the batch then comes from them.
    assert client.update_priorities("prio", keys[:10], 1e6) == 10
    batch = client.sample("prio", 100, timeout=5.0)
    assert (batch.data["x"] < 10).mean() > 0.95
    assert (client.shard_of(batch.info.keys) == 0).mean() > 0.95
    # a learner's update carried by the next sample request reaches the right shards
    client.sample("prio", 4, timeout=5.0, update=(keys[:10], np.full(10, 1e-9)))
    assert client.shard_info("prio")[0].samples >= 100
    assert client.delete("prio", keys[10:15]) == 5  # shard 1 only
    assert [i.size for i in client.shard_info("prio").values()] == [10, 5, 10]
    assert client.info("prio").size == 25
    assert client.delete("prio", keys[10:15]) == 0  # stale keys: skipped
    sizes_before = client.info("prio").size
    with pytest.raises(InvalidArgumentError, match="not keys of this sharded table"):
        client.update_priorities("prio", np.array([keys[0], 3 << 30]), [1.0, 1.0])
    with pytest.raises(InvalidArgumentError, match="priorities"):
        client.update_priorities("prio", keys[:2], [1.0, -1.0])
    assert client.info("prio").size == sizes_before


def test_inserts_and_writers_refuse_a_store_whose_slots_reach_the_shard_bits():
    """With 4097 shards a key keeps 19 slot bits: a store of 2**20 rows would issue keys
    naming another shard. Refused before the shard takes a row (the other addresses are
    never contacted: the rows go to shard 0)."""
    big = Table("big", signature={"x": "int64"}, max_size=8, capacity=1 << 20)
    server = Server([big]).start()
    try:
        addresses = [server.address] + [f"ipc:///nowhere/shard-{i}" for i in range(4096)]
        many = ShardedClient(addresses, first_shard=0, call_timeout=10.0)
        with pytest.raises(InvalidArgumentError, match="store_capacity=1048576"):
            many.insert("big", {"x": np.arange(3)})
        with pytest.raises(InvalidArgumentError, match="store_capacity=1048576"):
            many.trajectory_writer("big", shard=0)
        many.close()
        assert big.size == 0 and big.store.next_id == 0
    finally:
        server.stop()


def test_a_table_handle_has_a_local_tables_calls_over_all_shards(client):
    replay = client.table("uni")
    keys = np.concatenate([replay.insert(rows(10 * i, 10)) for i in range(NUM_SHARDS)])
    assert sorted(set(client.shard_of(keys).tolist())) == list(range(NUM_SHARDS))
    assert len(replay) == 30 and replay.info().size == 30
    assert replay.layout.span == 1 and replay.can_sample(8)
    batch = replay.sample(8, timeout=5.0)
    assert batch.info.table_size == 30
    assert replay.delete(batch.info.keys[:1]) == 1
    assert "ShardedTable('uni' over" in repr(replay)


def test_a_writers_steps_stay_on_one_shard_and_writers_take_turns(client):
    counts = []
    for w in range(NUM_SHARDS + 1):
        with client.trajectory_writer("seq", keep_keys=True) as writer:
            for i in range(6):
                writer.append({"x": np.int64(100 * w + i), "obs": np.zeros(2, np.float32)})
                if i:
                    writer.create_item("seq")
            writer.flush(timeout=10.0)
            keys = np.concatenate(writer.keys)
        assert len(keys) == 5 and len(set(client.shard_of(keys).tolist())) == 1
        counts.append(int(client.shard_of(keys)[0]))
    assert counts == [0, 1, 2, 0]
    batch = client.sample("seq", 64, timeout=5.0)
    # next_obs of every item is its own writer's next step (steps never mixed)
    assert [i.size for i in client.shard_info("seq").values()] == [10, 5, 5]
    assert batch.data["x"].shape == (64,)


def test_entering_a_closed_shard_writer_raises_closed_error(client):
    writer = client.trajectory_writer("seq")
    writer.close()
    with pytest.raises(ClosedError, match="closed"), writer:
        pass


CLOSED_CALLS = {
    "insert": lambda c: c.insert("uni", rows(0, 2)),
    "sample": lambda c: c.sample("uni", 1),
    "info": lambda c: c.info("uni"),
    "update_priorities": lambda c: c.update_priorities("prio", np.array([0]), 1.0),
    "delete": lambda c: c.delete("uni", np.array([0])),
    "trajectory_writer": lambda c: c.trajectory_writer("seq"),
    "sample_iterator": lambda c: c.sample_iterator("uni", 1),
    "checkpoint": lambda c: c.checkpoint(),
    "can_sample": lambda c: c.can_sample("uni", 1),
}


@pytest.mark.parametrize("call", CLOSED_CALLS.values(), ids=CLOSED_CALLS.keys())
def test_a_closed_sharded_client_names_itself_in_every_calls_error(addresses, call):
    sharded = ShardedClient(addresses)
    sharded.close()
    with pytest.raises(ClosedError, match=r"this ShardedClient of \[.*\] was closed"):
        call(sharded)
    assert pickle.loads(pickle.dumps(sharded)).info("uni").size >= 0  # a copy is open


def test_learner_iterator_keeps_a_request_to_every_shard_in_flight(client):
    fill(client, "uni", [10, 10, 10])
    with client.sample_iterator("uni", 16, in_flight=3, timeout=5.0) as it:
        first = next(it)
        assert len(first) == 16
        rounds = list(it._rounds)
        assert len(rounds) == 2  # two batches outstanding
        for rnd in rounds:  # each with one request to every shard, sent already
            assert sorted(rnd.rids) == [0, 1, 2]
        it.update_priorities(first.info.keys, 1.0)
        assert sorted(it._updates) == [0, 1, 2]  # queued per shard
        next(it)
        assert it._updates == {}  # carried by the round just sent
    assert client.shard_info("uni")[0].samples + client.shard_info("uni")[1].samples > 0


def test_iterator_drawing_several_batches_per_request_keeps_the_distribution(client):
    fill(client, "prio", [5, 11, 8, 6, 10], prio_of)
    big = one_big_table("prio", Prioritized(ALPHA), prio_of, 40)
    expected = big.index.sampler.probabilities(np.arange(40))
    counts, sizes = np.zeros(40), []
    with client.sample_iterator("prio", 250, in_flight=2, timeout=5.0,
                                batches_per_request=4) as it:
        for _ in range(80):
            batch = next(it)
            sizes.append(len(batch))
            x = batch.data["x"]
            np.testing.assert_allclose(batch.info.probabilities, expected[x], rtol=1e-6)
            counts += np.bincount(x, minlength=40)
        in_flight = list(it._rounds)
    assert sizes == [250] * 80 and all(r.batch_size == 1000 for r in in_flight)
    assert scipy_stats.chisquare(counts, expected * 20_000).pvalue > 1e-3
    shard_samples = sum(i.samples for i in client.shard_info("prio").values())
    # 20 requests of 1000 taken, one more in flight (sampled already: sent earlier on the
    # same connections as the info calls)
    assert len(in_flight) == 1 and shard_samples == 21_000
    with pytest.raises(InvalidArgumentError, match="batch_size=1250"):
        client.sample_iterator("prio", 250, batches_per_request=5)  # 1250 > max_size


def test_iterator_updates_reach_each_keys_shard(client):
    keys = fill(client, "prio", [10, 10, 10], lambda x: np.ones(len(x)))
    with client.sample_iterator("prio", 32, in_flight=2, timeout=5.0) as it:
        batch = next(it)
        it.update_priorities(keys, 1.0 + np.arange(30))  # carried by the next round
        next(it)
        it.update_priorities(keys[:5], 0.5)  # queued: sent by close()
    batch = client.sample("prio", 500, timeout=5.0)
    got = dict(zip(batch.data["x"].tolist(), batch.info.priorities.tolist()))
    assert all(p == (0.5 if x < 5 else 1.0 + x) for x, p in got.items())
    assert len(got) > 20


def test_a_closed_sharded_iterator_stops_and_refuses_priorities(client):
    keys = fill(client, "prio", [10, 10, 10], lambda x: np.ones(len(x)))
    it = client.sample_iterator("prio", 4, timeout=5.0)
    next(it)
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(ClosedError, match="update_priorities"):
        it.update_priorities(keys[:2], 1.0)


def test_samplers_that_cannot_be_split_are_refused(client):
    fill(client, "fifo", [3, 3, 3])
    with pytest.raises(InvalidArgumentError, match="Uniform or Prioritized"):
        client.sample("fifo", 2, timeout=2.0)


def test_a_batch_must_fit_every_shard_since_any_may_draw_all_of_it(client):
    fill(client, "uni", [10, 10, 10])
    for bad in (0, 1001, 2.0, True):
        with pytest.raises(InvalidArgumentError, match="batch_size"):
            client.sample("uni", bad, timeout=2.0)
        with pytest.raises(InvalidArgumentError, match="batch_size"):
            client.sample_iterator("uni", bad)
    assert len(client.sample("uni", 1000, timeout=5.0)) == 1000


def test_constructor_refuses_bad_arguments(addresses):
    cases = [
        ((), {}, "non-empty list"),
        ("tcp://127.0.0.1:1", {}, "non-empty list"),
        ([addresses[0], addresses[0]], {}, "repeat a server"),
        (addresses, {"on_shard_down": "ignore"}, "choose one of"),
        (addresses, {"server_public_key": [None]}, "one per shard"),
        (addresses, {"first_shard": -1}, "first_shard"),
    ]
    for addrs, kwargs, message in cases:
        with pytest.raises(InvalidArgumentError, match=message):
            ShardedClient(addrs, **kwargs)


def test_a_pickled_client_inserts_from_another_process(client):
    out = CTX.Queue()
    proc = CTX.Process(target=insert_through, args=(client, "uni", 7, out), daemon=True)
    proc.start()
    try:
        status, keys = out.get(timeout=60.0)
    finally:
        proc.join(10.0)
    assert status == "ok", keys
    assert len(keys) == 7 and client.info("uni").size == 7
    assert client.delete("uni", keys) == 7


def test_a_shard_whose_limiter_admits_no_sample_is_left_out_of_the_split(client):
    client.shards[0].insert("held", rows(0, 10))  # may be sampled
    client.shards[1].insert("held", rows(10, 2))  # waits for 5 items: no credit
    batch = client.sample("held", 64, timeout=2.0)
    assert len(batch) == 64 and (batch.data["x"] < 10).all()
    np.testing.assert_allclose(batch.info.probabilities, 1 / 10)  # over what can be drawn
    assert batch.info.table_size == 12
    client.shards[1].insert("held", rows(12, 3))  # now it may be sampled too
    client.sample("held", 64, timeout=2.0)  # (split as the last replies said; learns it)
    x = np.concatenate([client.sample("held", 64, timeout=2.0).data["x"] for _ in range(4)])
    assert (x >= 10).mean() == pytest.approx(5 / 15, abs=0.1)


def ratio_shards(client, prio0: float, prio1: float, n1: int = 2) -> None:
    """Shard 0: 10 items of priority prio0 (may sample 19 items: inserts - samples + 9);
    shard 1: n1 items of priority prio1 (may sample n1 + 9)."""
    client.shards[0].insert("ratio", rows(0, 10), prio0)
    client.shards[1].insert("ratio", rows(10, n1), prio1)


def no_shard_covers_a_batch_of_16(client) -> None:
    """Shard 0's credit down to 15 (its own client samples 4): with no shard's credit
    covering a batch of 16, the split runs over every shard with some credit."""
    client.shards[0].sample("ratio", 4, timeout=1.0)


def test_a_part_its_shards_limiter_holds_back_waits_then_is_completed_once(client):
    ratio_shards(client, 1.0, 100.0)  # shard 1 is to draw ~15 of 16: more than its 11
    no_shard_covers_a_batch_of_16(client)
    with pytest.raises(RateLimiterTimeoutError):
        client.sample("ratio", 16, timeout=0.3)
    drawn = client.shard_info("ratio")[0].samples - 4
    assert drawn < 16 and client.shard_info("ratio")[1].samples == 0
    client.shards[1].insert("ratio", rows(12, 8), 100.0)  # its credit now covers the part
    batch = client.sample("ratio", 16, timeout=5.0)
    infos = client.shard_info("ratio")
    assert len(batch) == 16 and infos[0].samples == 4 + drawn  # shard 0's part kept
    assert infos[0].samples + infos[1].samples == 4 + 16
    # split with the masses known when the batch began (10 vs 200), each part drawn from
    # its shard as it was then
    x = batch.data["x"]
    np.testing.assert_allclose(batch.info.probabilities[x < 10], 10 / 210 / 10)
    np.testing.assert_allclose(batch.info.probabilities[x >= 10], 200 / 210 / 10)


def test_a_held_part_its_shard_cannot_cover_is_drawn_from_the_other_shards(client):
    ratio_shards(client, 1.0, 100.0)
    no_shard_covers_a_batch_of_16(client)
    with pytest.raises(RateLimiterTimeoutError):
        client.sample("ratio", 16, timeout=0.3)
    # shard 0's credit now covers the whole batch: as many inserts as its limiter takes
    # (up to inserts - samples = 11, credit 20), of items of priority 0 (never drawn)
    info = client.shard_info("ratio")[0]
    room = 11 - (info.inserts - info.samples)
    client.shards[0].insert("ratio", rows(20, room), 0.0)
    batch = client.sample("ratio", 16, timeout=5.0)  # shard 1 left out of this batch
    assert len(batch) == 16 and (batch.data["x"] < 10).all()
    np.testing.assert_allclose(batch.info.probabilities, 1 / 10)
    infos = client.shard_info("ratio")
    assert infos[0].samples == 4 + 16 and infos[1].samples == 0


def test_a_held_part_of_a_batch_split_over_one_shard_moves_to_the_shards_left_out(client):
    # Only shard 0's credit covered a batch when it was split (shard 1 had 5 of 16), but
    # shard 0's credit was taken meanwhile (its own client sampled 10): its part is held
    # back. Shard 1's writer then inserts: the next call draws the batch over shard 1
    # instead of asking shard 0, whose writers finished, again and again.
    ratio_shards(client, 1.0, 1.0)
    client.shards[1].sample("ratio", 6, timeout=1.0)  # shard 1: credit 2 - 6 + 9 = 5
    assert client.can_sample("ratio", 16)  # the client learns every shard's credit
    client.shards[0].sample("ratio", 10, timeout=1.0)  # shard 0: credit 19 - 10 = 9
    with pytest.raises(RateLimiterTimeoutError):
        client.sample("ratio", 16, timeout=0.3)
    client.shards[1].insert("ratio", rows(12, 11), 1.0)  # shard 1: credit 16
    assert client.can_sample("ratio", 16)
    batch = client.sample("ratio", 16, timeout=0.3)
    assert set(client.shard_of(batch.info.keys).tolist()) == {1}
    np.testing.assert_allclose(batch.info.probabilities, 1 / 13)
    assert [i.samples for i in client.shard_info("ratio").values()][:2] == [10, 6 + 16]


def test_writers_of_one_shard_finishing_first_do_not_stop_the_learner(client):
    # Shard 0 holds the heavy items but may sample 19 more; then only shard 1 can give.
    ratio_shards(client, 100.0, 1.0, n1=10)
    assert client.can_sample("ratio", 19) and not client.can_sample("ratio", 20)
    got, timeouts = 0, 0
    for _ in range(12):
        try:
            got += len(client.sample("ratio", 8, timeout=0.3))
        except RateLimiterTimeoutError:
            timeouts += 1
        if got == 32:
            break
    infos = client.shard_info("ratio")
    assert got == 32, (got, timeouts, infos)
    assert infos[0].samples <= 19 and infos[0].samples + infos[1].samples == 32
    assert timeouts <= 2
    assert client.can_sample("ratio", 1) and not client.can_sample("ratio", 19 + 19 - 31)


def test_inserts_return_keys_that_carry_the_shard(client):
    keys = [client.insert("uni", rows(5 * i, 5)) for i in range(3)]
    assert [len(k) for k in keys] == [5, 5, 5]
    assert all(k.dtype == np.int64 for k in keys)
    assert [set(client.shard_of(k).tolist()) for k in keys] == [{0}, {1}, {2}]
    assert client.delete("uni", np.concatenate(keys)) == 15
