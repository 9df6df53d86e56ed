"""A learner's priority updates sent with its sample requests (one round trip a cycle):
applied in order before the sample, stale keys skipped and counted, bad input rejected
with the error update_priorities gives and nothing changed, and the server keeps serving.
Also: a request in another protocol version is refused, saying which one is spoken."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq
from netprocs import STEP_SIGNATURE, config, served

import rlreplay
from rlreplay.errors import InvalidArgumentError, RateLimiterTimeoutError

TABLES = config(
    {
        "name": "prio",
        "signature": STEP_SIGNATURE,
        "max_size": 100,
        "sampler": {"type": "Prioritized", "priority_exponent": 1.0},
    },
    {
        "name": "gated",
        "signature": STEP_SIGNATURE,
        "max_size": 100,
        # A sampler that uses priorities: a uniform table keeps none to read back.
        "sampler": {"type": "Prioritized", "priority_exponent": 1.0},
        "rate_limiter": {"type": "MinSize", "min_size_to_sample": 5},
    },
)


def rows(n: int, first: int = 0) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n)
    return {"obs": np.repeat(ids[:, None], 3, 1).astype(np.float32), "step": ids}


@pytest.fixture(scope="module")
def client():
    with served(TABLES) as (address, _):
        c = rlreplay.Client(address, call_timeout=10.0)
        yield c
        c.close()


@pytest.fixture(autouse=True)
def fresh_tables(client):
    for name in ("prio", "gated"):
        client.reset(name)
    yield


def test_updates_sent_without_waiting_leave_nothing_behind_in_the_client(client):
    """A learner sends millions of unawaited updates: none is kept as a request awaiting
    a reply (no reply ever comes), so the client's memory stays flat."""
    keys = client.insert("prio", rows(10))
    channel = client.transport.channel()
    before = len(channel.pending), len(channel.replies)
    for i in range(500):
        assert client.update_priorities("prio", keys, np.full(10, 1.0 + i), wait=False) is None
    assert client.info("prio").size == 10  # a call after them: all were taken
    assert (len(channel.pending), len(channel.replies)) == before
    assert np.allclose(client.sample("prio", 10, timeout=5.0).info.priorities, 500.0)


def test_update_with_a_sample_is_applied_before_that_sample(client):
    keys = client.insert("prio", rows(2), priorities=[1.0, 0.0])
    batch = client.sample("prio", 20, timeout=5.0, update=(keys, [0.0, 1.0]))
    assert set(batch.info.keys.tolist()) == {int(keys[1])}
    np.testing.assert_array_equal(batch.info.priorities, 1.0)


def test_updates_with_consecutive_samples_apply_in_order(client):
    keys = client.insert("prio", rows(3), priorities=1.0)
    for i in range(2, 7):
        batch = client.sample("prio", 8, timeout=5.0, update=(keys, [float(i)] * 3))
        np.testing.assert_array_equal(batch.info.priorities, float(i))
    # Within one update a key given twice takes its last priority, as in a local table.
    batch = client.sample("prio", 8, timeout=5.0, update=(keys[[0, 0]], [9.0, 0.0]))
    assert int(keys[0]) not in batch.info.keys.tolist()


def test_stale_keys_in_an_update_are_skipped_and_counted(client):
    keys = client.insert("prio", rows(2), priorities=1.0)
    assert client.delete("prio", keys[:1]) == 1
    before = client.info("prio").stale_updates
    batch = client.sample("prio", 4, timeout=5.0, update=(keys, [5.0, 5.0]))
    assert client.info("prio").stale_updates == before + 1
    assert set(batch.info.keys.tolist()) == {int(keys[1])}
    np.testing.assert_array_equal(batch.info.priorities, 5.0)


BAD_UPDATES = {
    "fewer priorities than keys": lambda keys: (keys, [1.0]),
    "negative priority": lambda keys: (keys, [1.0, -1.0]),
    "nan priority": lambda keys: (keys, [1.0, float("nan")]),
    "key this table never made": lambda keys: (np.array([keys[0], 1 << 40]), [1.0, 1.0]),
    "negative key": lambda keys: (np.array([-1, keys[0]]), [1.0, 1.0]),
    "keys not integers": lambda keys: (keys.astype(np.float64), [1.0, 1.0]),
    "keys of text": lambda keys: (["a", "b"], [1.0, 1.0]),
    "keys 2-d": lambda keys: (keys[None], [1.0, 1.0]),
}


@pytest.mark.parametrize("case", sorted(BAD_UPDATES))
def test_bad_update_with_a_sample_raises_like_update_priorities_and_changes_nothing(client, case):
    keys = client.insert("prio", rows(2), priorities=[1.0, 0.0])
    bad = BAD_UPDATES[case](keys)
    with pytest.raises(InvalidArgumentError):
        client.update_priorities("prio", *bad)
    info = client.info("prio")
    with pytest.raises(InvalidArgumentError):
        client.sample("prio", 4, timeout=5.0, update=bad)
    after = client.info("prio")
    assert (after.samples, after.stale_updates) == (info.samples, info.stale_updates)
    batch = client.sample("prio", 20, timeout=5.0)  # still serving, priorities unchanged
    assert set(batch.info.keys.tolist()) == {int(keys[0])}
    np.testing.assert_array_equal(batch.info.priorities, 1.0)


def test_update_that_is_not_a_pair_is_rejected(client):
    keys = client.insert("prio", rows(2))
    with pytest.raises(InvalidArgumentError, match="update="):
        client.sample("prio", 2, timeout=5.0, update=[keys])


def test_update_stays_applied_when_its_sample_times_out(client):
    keys = client.insert("gated", rows(2), priorities=1.0)
    with pytest.raises(RateLimiterTimeoutError):
        client.sample("gated", 1, timeout=0.2, update=(keys, [3.0, 4.0]))
    client.insert("gated", rows(3, 2), priorities=1.0)
    batch = client.sample("gated", 64, timeout=5.0)
    seen = dict(zip(batch.info.keys.tolist(), batch.info.priorities.tolist()))
    for key, priority in zip(keys.tolist(), (3.0, 4.0)):
        assert seen.get(key, priority) == priority
    assert client.info("gated").samples == 64  # the sample that timed out drew nothing


def test_iterator_sends_queued_updates_with_its_next_request(client):
    keys = client.insert("prio", rows(2), priorities=[1.0, 0.0])
    with client.sample_iterator("prio", 16, in_flight=1, timeout=5.0) as it:
        first = next(it)
        assert set(first.info.keys.tolist()) == {int(keys[0])}
        it.update_priorities(keys[:1], [0.0])
        it.update_priorities(keys[1:], [2.0])  # queued together, sent in order
        second = next(it)
        assert set(second.info.keys.tolist()) == {int(keys[1])}
        np.testing.assert_array_equal(second.info.priorities, 2.0)
        it.update_priorities(keys, [1.0, 0.0])  # still queued when the iterator closes
    batch = client.sample("prio", 16, timeout=5.0)
    assert set(batch.info.keys.tolist()) == {int(keys[0])}


def test_iterator_rejects_bad_updates_and_keeps_sampling(client):
    keys = client.insert("prio", rows(2), priorities=1.0)
    with client.sample_iterator("prio", 4, in_flight=1, timeout=5.0) as it:
        with pytest.raises(InvalidArgumentError):
            it.update_priorities(keys, [1.0, float("inf")])  # checked at once
        it.update_priorities(np.array([1 << 40]), [2.0])  # only the server knows the keys
        with pytest.raises(InvalidArgumentError):
            next(it)
        assert len(next(it)) == 4
    assert client.info("prio").samples == 4  # the rejected request drew nothing


@pytest.fixture()
def raw_socket(client):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(client.address)
    yield sock
    sock.close()


def request(sock: zmq.Socket, frames: list) -> tuple[dict, list]:
    sock.send_multipart(frames)
    assert sock.poll(5000), "no reply"
    reply = sock.recv_multipart()
    return msgpack.unpackb(reply[0]), reply[1:]


def test_a_request_in_another_protocol_version_is_refused_naming_both(client, raw_socket):
    keys = client.insert("prio", rows(3), priorities=1.0)
    meta = [["keys", "<i8", [3]], ["priorities", "<f8", [3]]]
    head = {"v": 1, "id": 2, "op": "update_priorities", "table": "prio", "arrays": meta}
    frames = [msgpack.packb(head), keys.tobytes(), np.full(3, 2.0).tobytes()]
    header, _ = request(raw_socket, frames)
    assert (header["id"], header["ok"], header["code"]) == (2, False, 9)  # ProtocolError
    assert "protocol version 1 is not supported; this side speaks 2" in header["message"]
    assert client.info("prio").size == 3  # nothing changed; the server goes on


def test_packed_arrays_outside_their_frame_are_protocol_errors(client, raw_socket):
    for entry in (["keys", "<i8", [2], 1, 8], ["keys", "<i8", [2], 2, 0], ["keys", "<i8", [2]]):
        head = {"v": 2, "id": 1, "op": "delete", "table": "prio", "arrays": [entry]}
        header, _ = request(raw_socket, [msgpack.packb(head), bytes(16)])
        assert (header["ok"], header["code"]) == (False, 9), entry  # ProtocolError
    assert client.ping() == ["gated", "prio"]


def test_closing_an_iterator_cancels_its_parked_requests_so_a_queue_loses_no_item():
    """Requests a closed iterator left parked on the server (no deadline: they wait for
    items) are dropped by the server, not served to nobody: every item later put in the
    queue stays for the next reader, and the limiter counts only the samples delivered."""
    queue = config({"name": "q", "kind": "queue", "size": 100, "signature": STEP_SIGNATURE})
    with served(queue) as (address, _):
        c = rlreplay.Client(address, call_timeout=10.0)
        c.insert("q", rows(2))
        it = c.sample_iterator("q", 2, in_flight=3)
        assert next(it).data["step"].tolist() == [0, 1]
        it.close()  # two requests were parked: the queue is empty
        c.insert("q", rows(6, first=10))
        info = c.info("q")
        assert (info.size, info.samples) == (6, 2)
        batch = c.sample("q", 6, timeout=5.0)
        assert batch.data["step"].tolist() == list(range(10, 16))
        c.close()


def test_a_writer_chunk_with_a_priority_beyond_the_cap_is_refused_before_any_step_is_stored(
    client,
):
    from rlreplay.errors import InvalidArgumentError as Refused

    strong = config({"name": "sq", "signature": STEP_SIGNATURE, "max_size": 100,
                     "sampler": {"type": "Prioritized", "priority_exponent": 2.0}})  # fmt: skip
    with served(strong) as (address, _):
        c = rlreplay.Client(address, call_timeout=10.0)
        writer = c.trajectory_writer("sq")
        writer.append({"obs": np.zeros(3, np.float32), "step": np.int64(0)})
        writer.create_item("sq", priority=1e200)
        with pytest.raises(Refused, match="beyond the largest this table takes"):
            writer.flush()
        info = c.info("sq")
        assert (info.size, info.stored_steps) == (0, 0)
        writer.close()
        c.close()
