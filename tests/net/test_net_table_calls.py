"""Every table call through a server in another process: results, blocking, timeouts,
stale keys and bad input (a typed error, and the server keeps serving)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from netprocs import CTX, STEP_SIGNATURE, blocked_sample, config, served

import rlreplay
from rlreplay.errors import (
    DeadlockError,
    InvalidArgumentError,
    ProtocolError,
    RateLimiterTimeoutError,
    SignatureError,
)


def rows(n: int, first: int = 0) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n)
    return {"obs": np.repeat(ids[:, None], 3, 1).astype(np.float32), "step": ids}


def table(name: str, **extra) -> dict:
    return {"name": name, "signature": STEP_SIGNATURE, "max_size": 100, **extra}


TABLES = config(
    table("uniform"),
    table("prio", sampler={"type": "Prioritized", "priority_exponent": 1.0}),
    table("gated", rate_limiter={"type": "MinSize", "min_size_to_sample": 5}),
    table(
        "ratio",
        rate_limiter={
            "type": "SampleToInsertRatio",
            "samples_per_insert": 1.0,
            "min_size_to_sample": 1,
            "error_buffer": 2.0,
        },
    ),
    table("once", max_times_sampled=1),
)


@pytest.fixture(scope="module")
def client():
    with served(TABLES) as (address, _):
        c = rlreplay.Client(address, call_timeout=10.0)
        yield c
        c.close()


@pytest.fixture(autouse=True)
def fresh_tables(client):
    for name in ("uniform", "prio", "gated", "ratio", "once"):
        client.reset(name)
    yield


def test_insert_then_sample_returns_the_inserted_rows(client):
    keys = client.insert("uniform", rows(10))
    assert keys.dtype == np.int64 and len(np.unique(keys)) == 10
    batch = client.sample("uniform", 32, timeout=5.0)
    assert batch.data["obs"].shape == (32, 3)
    np.testing.assert_array_equal(batch.data["obs"][:, 0], batch.data["step"])
    assert set(batch.info.keys.tolist()) <= set(keys.tolist())
    assert batch.info.table_size == 10


def test_single_row_without_batch_axis_is_one_item(client):
    keys = client.insert("uniform", {"obs": np.zeros(3, np.float32), "step": 7})
    assert len(keys) == 1
    assert client.info("uniform").size == 1


def test_priorities_steer_sampling_and_updates_count_held_keys(client):
    keys = client.insert("prio", rows(2), priorities=[1.0, 0.0])
    batch = client.sample("prio", 50, timeout=5.0)
    assert set(batch.info.keys.tolist()) == {int(keys[0])}
    assert client.update_priorities("prio", keys, [0.0, 1.0]) == 2
    batch = client.sample("prio", 50, timeout=5.0)
    assert set(batch.info.keys.tolist()) == {int(keys[1])}
    np.testing.assert_allclose(batch.info.probabilities, 1.0)


def test_stale_keys_are_skipped_and_counted(client):
    keys = client.insert("uniform", rows(4))
    assert client.delete("uniform", keys[:2]) == 2
    assert client.delete("uniform", keys[:2]) == 0
    assert client.update_priorities("uniform", keys, np.ones(4)) == 2
    info = client.info("uniform")
    assert (info.size, info.stale_deletes, info.stale_updates) == (2, 2, 2)


def test_reset_removes_items_and_zeroes_counts(client):
    client.insert("uniform", rows(5))
    client.reset("uniform")
    info = client.info("uniform")
    assert (info.size, info.inserts, info.samples) == (0, 0, 0)


def test_can_insert_and_can_sample_answer_without_blocking(client):
    assert not client.can_sample("gated")
    client.insert("gated", rows(5))
    assert client.can_sample("gated", 1)
    assert client.can_insert("ratio", 1)


def test_max_times_sampled_removes_items_after_their_last_sample(client):
    client.insert("once", rows(3))
    batch = client.sample("once", 3, timeout=5.0)
    assert sorted(batch.data["step"].tolist()) == [0, 1, 2]
    assert client.info("once").size == 0


def test_sample_blocks_until_min_size_then_times_out(client):
    client.insert("gated", rows(4))
    start = time.monotonic()
    with pytest.raises(RateLimiterTimeoutError):
        client.sample("gated", 1, timeout=0.3)
    assert time.monotonic() - start >= 0.3
    assert client.info("gated").sample_blocked_s >= 0.25


def test_insert_blocks_when_ahead_of_samples_then_times_out(client):
    client.insert("ratio", rows(3))  # diff reaches max_diff (1 + 2)
    with pytest.raises(RateLimiterTimeoutError):
        client.insert("ratio", rows(1), timeout=0.2)
    assert client.info("ratio").size == 3  # the rejected insert stored nothing


def test_blocked_sample_in_another_process_resumes_when_rows_arrive(client):
    out = CTX.Queue()
    proc = CTX.Process(
        target=blocked_sample, args=(client.address, "gated", 20.0, out), daemon=True
    )
    proc.start()
    try:
        time.sleep(1.0)  # let the child park its request
        client.insert("gated", rows(5))
        status, n, waited = out.get(timeout=30.0)
        assert (status, n) == ("ok", 2)
        assert waited < 20.0
    finally:
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()


def test_one_blocked_client_does_not_stall_others(client):
    other = rlreplay.Client(client.address)
    rid = other.sample_async("gated", 1, timeout=2.0)
    for _ in range(20):  # served while the other request is parked
        client.insert("uniform", rows(1))
        client.sample("uniform", 1, timeout=1.0)
    with pytest.raises(RateLimiterTimeoutError):
        other.sample_result(rid, timeout=2.0)
    other.close()


BAD_CALLS = {
    "wrong_shape": (
        lambda c: c.insert("uniform", {"obs": np.zeros((2, 4)), "step": [1, 2]}),
        SignatureError,
    ),
    "missing_field": (lambda c: c.insert("uniform", {"obs": np.zeros((2, 3))}), SignatureError),
    "unknown_table": (lambda c: c.sample("nope", 1, timeout=1.0), InvalidArgumentError),
    "batch_zero": (lambda c: c.sample("uniform", 0, timeout=1.0), InvalidArgumentError),
    "batch_too_big": (lambda c: c.sample("uniform", 101, timeout=1.0), InvalidArgumentError),
    "negative_timeout": (lambda c: c.sample("uniform", 1, timeout=-1.0), InvalidArgumentError),
    "negative_priority": (
        lambda c: c.update_priorities("uniform", [0], [-1.0]),
        InvalidArgumentError,
    ),
    "nan_priority": (
        lambda c: c.insert("uniform", rows(1), priorities=[np.nan]),
        InvalidArgumentError,
    ),
    "foreign_key": (lambda c: c.delete("uniform", [(1 << 40) | 5000]), InvalidArgumentError),
    "float_keys": (lambda c: c.delete("uniform", [0.5]), InvalidArgumentError),
    "priority_count": (
        lambda c: c.update_priorities("uniform", [0, 1], [1.0]),
        InvalidArgumentError,
    ),
    "deadlocking_batch": (lambda c: c.sample("ratio", 50, timeout=1.0), DeadlockError),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_gets_a_typed_error_and_the_server_keeps_serving(client, case):
    call, error = BAD_CALLS[case]
    client.insert("uniform", rows(2))
    with pytest.raises(error):
        call(client)
    assert client.info("uniform").size == 2
    assert client.sample("uniform", 1, timeout=5.0).data["obs"].shape == (1, 3)


def test_malformed_messages_get_protocol_errors_and_the_server_keeps_serving(client):
    import msgpack
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(client.address)
    try:
        messages = [
            [b"\xc1garbage"],
            [msgpack.packb({"v": 999, "id": 1, "op": "ping"})],
            [msgpack.packb({"v": 1, "id": 5, "op": "ping"})],  # a version no longer spoken
            [
                msgpack.packb({"v": 2, "id": 2, "op": "ping", "arrays": [["a", "|O", [1], 1, 0]]}),
                b"x",
            ],
            [msgpack.packb({"v": 2, "id": 3, "op": "no_such_op"})],
            [
                msgpack.packb(
                    {
                        "v": 2,
                        "id": 4,
                        "op": "insert",
                        "table": "uniform",
                        "arrays": [["data/obs", "<f4", [2, 3], 1, 0]],
                    }
                ),
                b"short",
            ],
        ]
        for frames in messages:
            sock.send_multipart(frames)
            assert sock.poll(5000), "no reply to a malformed message"
            header = msgpack.unpackb(sock.recv_multipart()[0])
            assert header["ok"] is False
            assert header["code"] == 9, header  # ProtocolError
    finally:
        sock.close()
    assert issubclass(ProtocolError, rlreplay.ReplayError)
    assert client.ping() == sorted(["uniform", "prio", "gated", "ratio", "once"])


def test_remote_table_handle_has_the_local_table_calls(client):
    remote = client.table("uniform")
    keys = remote.insert(rows(3), priorities=2.0)
    assert len(remote) == 3
    assert remote.update_priorities(keys, [1.0, 1.0, 1.0]) == 3
    assert remote.sample(2, timeout=5.0).data["step"].shape == (2,)
    assert remote.delete(keys[:1]) == 1
    assert remote.can_sample() and remote.can_insert()
    remote.reset()
    assert remote.info().size == 0


def test_sample_iterator_keeps_requests_in_flight(client):
    client.insert("uniform", rows(20))
    with client.sample_iterator("uniform", 8, in_flight=3, timeout=5.0) as it:
        batches = [next(it) for _ in range(10)]
    assert all(b.data["obs"].shape == (8, 3) for b in batches)
    assert client.info("uniform").samples >= 80


def test_a_call_blocked_in_one_thread_does_not_hold_up_other_threads(client):
    import threading

    result = {}

    def blocked():
        try:
            result["n"] = len(client.sample("gated", 1, timeout=20.0))
        except Exception as exc:  # reported through the assertion below
            result["error"] = exc

    thread = threading.Thread(target=blocked)
    thread.start()
    try:
        start = time.monotonic()
        for i in range(5):  # served at once although the other thread waits
            client.insert("gated", rows(1, i))
            assert client.info("gated").size == i + 1
        assert time.monotonic() - start < 10.0
    finally:
        thread.join(30.0)
    assert result == {"n": 1}


PARITY = {
    "update_priorities_one_for_all": lambda t, k: t.update_priorities(k, 1.0),
    "update_priorities_numpy_scalar": lambda t, k: t.update_priorities(k, np.float32(2.5)),
    "update_priorities_lists": lambda t, k: t.update_priorities(k.tolist(), [1, 2, 3, 4]),
    "update_priorities_one_key": lambda t, k: t.update_priorities(k[0], 3.0),
    "delete_one_numpy_key": lambda t, k: t.delete(k[1]),
    "delete_list_of_keys": lambda t, k: t.delete(k[:2].tolist()),
    "sample_numpy_batch_size": lambda t, k: t.sample(np.int64(3), timeout=5.0),
    "sample_int_timeout": lambda t, k: t.sample(2, timeout=5),
    "can_insert_numpy_count": lambda t, k: t.can_insert(np.int64(2)),
    "can_sample_numpy_count": lambda t, k: t.can_sample(np.int32(2)),
    "insert_numpy_scalar_priority": lambda t, k: t.insert(rows(2, 10), np.float32(2.0)),
    "insert_int_priority": lambda t, k: t.insert(rows(2, 10), 3),
    "insert_priority_list": lambda t, k: t.insert(rows(2, 10), [1, 2]),
    "insert_numpy_timeout": lambda t, k: t.insert(rows(1, 10), timeout=np.float64(5.0)),
    "info": lambda t, k: (lambda i: (i.size, i.max_size, i.sampler, i.remover, i.inserts))(
        t.info()
    ),
}


def outcome(value):
    if isinstance(value, rlreplay.Sample):
        return ("sample", len(value))
    if isinstance(value, np.ndarray):
        return ("keys", len(value))
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return value


@pytest.mark.parametrize("case", sorted(PARITY))
def test_remote_table_accepts_every_argument_a_local_table_accepts(client, case):
    from rlreplay.net import tables_from_config

    spec = table("prio", sampler={"type": "Prioritized", "priority_exponent": 1.0})
    local = tables_from_config(config(spec))[0]
    results = []
    for t in (local, client.table("prio")):
        keys = t.insert(rows(4), [1.0, 2.0, 3.0, 4.0])
        try:
            results.append(outcome(PARITY[case](t, keys)))
        except Exception as exc:
            results.append(f"{type(exc).__name__}: {exc}")
    assert results[0] == results[1]


def test_a_remote_insert_timing_out_on_an_unconsumed_queue_says_why():
    queue = rlreplay.Table.queue("q", 2, signature={"x": "float32"})
    with rlreplay.Server([queue]) as server, rlreplay.Client(server.address) as client:
        client.insert("q", {"x": np.ones(2, np.float32)})
        with pytest.raises(rlreplay.RateLimiterTimeoutError, match="no sampler is consuming"):
            client.insert("q", {"x": np.ones(1, np.float32)}, timeout=0.3)
    assert queue.size == 2


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.can_sample(0),
        lambda t: t.can_insert(0),
        lambda t: t.can_sample("2"),
        lambda t: t.sample(0, timeout=1.0),
    ],
    ids=["can_sample_zero", "can_insert_zero", "can_sample_str", "sample_zero"],
)
def test_counts_a_table_refuses_are_refused_as_such_locally_and_remotely(client, call):
    """What sample() or insert() would refuse, can_sample() and can_insert() refuse too, and
    the message gives the range that holds (from 1)."""
    from rlreplay.net import tables_from_config

    spec = table("prio", sampler={"type": "Prioritized", "priority_exponent": 1.0})
    local = tables_from_config(config(spec))[0]
    for t in (local, client.table("prio")):
        t.insert(rows(4), [1.0, 2.0, 3.0, 4.0])
        with pytest.raises(InvalidArgumentError, match=r"must be an int (in \[1, |>= 1)"):
            call(t)


def test_an_empty_address_is_refused_as_empty():
    with pytest.raises(InvalidArgumentError, match="non-empty string"):
        rlreplay.Client("")
