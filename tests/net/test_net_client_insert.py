"""``Client.insert`` returns the new keys as ``Table.insert`` does (one round trip per
call): each row stored once under the key returned, priorities with their rows, bad input
refused by the call with a typed error and nothing stored, refused rows never stored, and
every row of a call answered before it returns (a process may exit right after). Real
servers in their own processes on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from netprocs import config, free_port, served

import rlreplay
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    RateLimiterTimeoutError,
    ServerUnavailableError,
    SignatureError,
)

GYM = {"obs": {"shape": [4], "dtype": "float32"}, "action": "int64", "reward": "float32",
       "done": "bool"}  # fmt: skip
RATIO = {"type": "SampleToInsertRatio", "samples_per_insert": 1.0, "min_size_to_sample": 1,
         "error_buffer": 2.0}  # fmt: skip
TABLES = config(
    {"name": "gym", "signature": GYM, "max_size": 10_000},
    {"name": "prio", "signature": GYM, "max_size": 10_000,
     "sampler": {"type": "Prioritized", "priority_exponent": 1.0}},
    {"name": "ratio", "signature": GYM, "max_size": 100, "rate_limiter": RATIO},
)  # fmt: skip


def step(i: int, obs_dtype=np.float32) -> dict:
    """Row ``i`` as a gymnasium loop gives it: numpy scalars and bools."""
    return {
        "obs": np.full(4, i, obs_dtype),
        "action": np.int64(i % 3),
        "reward": np.float64(i),
        "done": np.bool_(i % 7 == 0) if i % 2 else bool(i % 7 == 0),
    }


def block(first: int, n: int) -> dict:
    return {k: np.stack([step(i)[k] for i in range(first, first + n)]) for k in GYM}


@pytest.fixture(scope="module")
def address():
    with served(TABLES) as (addr, _):
        yield addr


@pytest.fixture
def client(address):
    c = rlreplay.Client(address, call_timeout=10.0)
    for name in ("gym", "prio", "ratio"):
        c.reset(name)
    yield c
    c.close()


def all_rows(client, table: str, n: int) -> dict:
    """Every row of a uniform table by key (sampled until each was seen; bounded)."""
    seen: dict[int, tuple] = {}
    for _ in range(200):
        s = client.sample(table, 256, timeout=5.0)
        for k, o, a, r, d in zip(s.info.keys, s.data["obs"], s.data["action"],
                                 s.data["reward"], s.data["done"]):  # fmt: skip
            seen[int(k)] = (o.tolist(), int(a), float(r), bool(d))
        if len(seen) == n:
            break
    return seen


def test_single_rows_of_gymnasium_scalars_return_the_keys_the_server_assigned(client):
    n = 300
    keys = [client.insert("gym", step(i, np.float64 if i % 5 == 0 else np.float32))
            for i in range(n)]  # fmt: skip
    assert all(type(k) is np.ndarray and k.dtype == np.int64 and k.shape == (1,) for k in keys)
    assert client.info("gym").size == n  # each call answered before it returned
    keys = np.concatenate(keys)
    assert len(np.unique(keys)) == n
    rows = all_rows(client, "gym", n)
    assert sorted(rows) == sorted(keys.tolist())  # the keys the server's table assigned
    for i, key in enumerate(keys.tolist()):  # each key names its own row
        assert rows[key] == ([float(i)] * 4, i % 3, float(i), i % 7 == 0)


def test_keys_match_what_a_local_table_returns_for_the_same_calls(client):
    local = rlreplay.Table("gym", signature=client.signature("gym"), max_size=10_000)
    for call in (lambda t: t(step(0)), lambda t: t(block(1, 10)), lambda t: t(step(11))):
        remote_keys = call(lambda rows: client.insert("gym", rows))
        local_keys = call(local.insert)
        assert remote_keys.dtype == local_keys.dtype and remote_keys.shape == local_keys.shape
    assert client.info("gym").size == local.size == 12


def test_priorities_travel_with_their_rows(client):
    keys = [client.insert("prio", step(i), priorities=1.0 if i == 17 else 0.0) for i in range(40)]
    batch = client.sample("prio", 64, timeout=5.0)
    assert set(batch.data["reward"].tolist()) == {17.0}
    assert set(batch.info.keys.tolist()) == {int(keys[17][0])}


def test_batched_calls_and_single_rows_keep_their_order_and_keys(client):
    first = client.insert("gym", step(0))
    middle = client.insert("gym", block(1, 10))
    last = client.insert("gym", step(11))
    keys = np.concatenate([first, middle, last])
    assert len(middle) == 10 and len(np.unique(keys)) == 12
    assert np.all(np.diff(keys) > 0)  # in the order the calls were made
    rows = all_rows(client, "gym", 12)
    assert [rows[k][2] for k in keys.tolist()] == [float(i) for i in range(12)]


def test_inserts_from_several_threads_each_get_their_own_keys(client):
    got: dict[int, list] = {t: [] for t in range(4)}

    def insert(t: int) -> None:
        for i in range(25):
            got[t].append(client.insert("gym", step(100 * t + i)))

    threads = [threading.Thread(target=insert, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60.0)
    assert not any(th.is_alive() for th in threads)
    keys = np.concatenate([k for t in got for k in got[t]])
    assert len(np.unique(keys)) == 100 and client.info("gym").size == 100
    rows = all_rows(client, "gym", 100)
    for t in got:
        assert [rows[int(k[0])][2] for k in got[t]] == [float(100 * t + i) for i in range(25)]


BAD_CALLS = {
    "obs of another shape": (lambda c: c.insert("gym", {**step(0), "obs": np.zeros(5)}),
                             SignatureError),
    "a field missing": (lambda c: c.insert("gym", {"obs": np.zeros(4)}), SignatureError),
    "a float action": (lambda c: c.insert("gym", {**step(0), "action": 1.5}), SignatureError),
    "an int no float holds": (lambda c: c.insert("gym", {**step(0), "reward": 10**400}),
                              SignatureError),
    "a complex reward": (lambda c: c.insert("gym", {**step(0), "reward": np.complex64(1)}),
                         SignatureError),
    "nan priority": (lambda c: c.insert("prio", step(0), priorities=np.nan),
                     InvalidArgumentError),
    "negative priority": (lambda c: c.insert("prio", step(0), priorities=-1.0),
                          InvalidArgumentError),
    "infinite priority": (lambda c: c.insert("prio", step(0), priorities=float("inf")),
                          InvalidArgumentError),
    "negative numpy priority": (lambda c: c.insert("prio", step(0),
                                                   priorities=np.float64(-0.5)),
                                InvalidArgumentError),
    "priorities of another count": (lambda c: c.insert("prio", block(0, 3),
                                                       priorities=[1.0, 2.0]),
                                    InvalidArgumentError),
    "an unknown table": (lambda c: c.insert("nope", step(0)), InvalidArgumentError),
    "a bad timeout": (lambda c: c.insert("gym", step(0), timeout=-1), InvalidArgumentError),
    "more rows than max_size": (lambda c: c.insert("ratio", block(0, 101)),
                                InvalidArgumentError),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_raises_a_typed_error_and_nothing_is_stored(client, case):
    call, error = BAD_CALLS[case]
    client.insert("gym", step(0))
    with pytest.raises(error):
        call(client)
    assert client.info("gym").size == 1
    assert client.info("prio").size == 0 and client.info("ratio").size == 0
    assert len(client.insert("gym", step(1))) == 1  # the client goes on


def test_bad_input_errors_name_the_argument_and_value(client):
    with pytest.raises(InvalidArgumentError, match=r"timeout.*-1"):
        client.insert("gym", step(0), timeout=-1)
    with pytest.raises(InvalidArgumentError, match="'nope'"):
        client.insert("nope", step(0))


def test_rows_the_limiter_refuses_raise_from_the_call_and_are_never_stored(client):
    # the limiter admits 3 rows without samples: the first go in, the rest are refused
    keys = [client.insert("ratio", step(i), timeout=0.3) for i in range(3)]
    assert [len(k) for k in keys] == [1, 1, 1]
    start = time.monotonic()
    with pytest.raises(RateLimiterTimeoutError):
        client.insert("ratio", block(3, 2), timeout=0.3)
    assert time.monotonic() - start < 0.3 + 2.0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # never stored later
        assert client.info("ratio").size == 3
        time.sleep(0.1)
    client.sample("ratio", 2, timeout=5.0)  # room for two more: the client goes on
    assert len(client.insert("ratio", block(3, 2), timeout=5.0)) == 2


def test_an_insert_without_timeout_waits_for_the_limiter(client):
    for i in range(3):
        client.insert("ratio", step(i))
    keys: list = []
    blocked = threading.Thread(target=lambda: keys.append(client.insert("ratio", step(3))))
    blocked.start()
    time.sleep(0.3)
    assert blocked.is_alive() and client.info("ratio").size == 3
    client.sample("ratio", 2, timeout=5.0)
    blocked.join(10.0)
    assert not blocked.is_alive() and len(keys[0]) == 1
    assert client.info("ratio").size == 4


def test_an_insert_to_a_dead_server_raises_server_unavailable_and_stores_nothing_later():
    with served(TABLES) as (address, proc):
        client = rlreplay.Client(address, call_timeout=1.0, diagnose_timeout=0.0, liveness_s=1.0)
        client.insert("gym", step(0))
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(ServerUnavailableError):
                client.insert("gym", step(1), timeout=0.5)
            assert time.monotonic() - start < 0.5 + 0.5 + 2.0
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.3)
        assert client.info("gym").size == 1  # the insert that raised was not applied
        proc.kill()
        proc.join(10.0)
        with pytest.raises(ServerUnavailableError):
            client.insert("gym", step(2))
        client.close()


def test_a_closed_client_refuses_inserts(address):
    client = rlreplay.Client(address)
    client.insert("gym", step(0))
    client.close()
    with pytest.raises(ClosedError):
        client.insert("gym", step(1))


def test_a_closed_client_hands_out_no_writer_or_iterator_even_for_a_table_it_knows(address):
    client = rlreplay.Client(address)
    client.insert("gym", step(0))
    client.trajectory_writer("gym").close()  # the table is described now
    client.close()
    for make in (
        lambda: client.trajectory_writer("gym"),
        lambda: client.sample_iterator("gym", 1),
    ):
        with pytest.raises(ClosedError, match="closed"):
            make()


def test_a_closed_sample_iterator_stops_and_refuses_priorities(client):
    client.insert("prio", block(0, 4))
    it = client.sample_iterator("prio", 2, timeout=5.0)
    batch = next(it)
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    assert list(it) == []
    with pytest.raises(ClosedError, match="update_priorities"):
        it.update_priorities(batch.info.keys, np.ones(2))


def test_an_address_of_none_says_a_server_has_one_once_started():
    with pytest.raises(InvalidArgumentError, match=r"start\(\)"):
        rlreplay.Client(None)


def test_leaving_a_with_block_by_an_error_does_not_wait_for_a_dead_server():
    with served(TABLES) as (address, proc):
        client = rlreplay.Client(address, call_timeout=20.0)
        client.insert("gym", step(0))
        proc.kill()
        proc.join(10.0)
        start = time.monotonic()
        with pytest.raises(KeyError), client:
            raise KeyError("the caller's own error")
        assert time.monotonic() - start < 5.0


def test_a_process_that_exits_right_after_its_inserts_has_every_row_stored(address):
    rlreplay.Client(address).reset("gym")
    code = (
        "import numpy as np, rlreplay\n"
        f"c = rlreplay.Client({address!r})\n"
        "for i in range(200):\n"
        "    c.insert('gym', {'obs': np.zeros(4, np.float32), 'action': i, 'reward': 0.5,"
        " 'done': False})\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=env)
    reader = rlreplay.Client(address)
    assert reader.info("gym").size == 200
    reader.close()


def test_a_call_to_a_port_where_nothing_listens_says_so_while_it_waits(caplog):
    from rlreplay.net.client import transport

    wait = transport.UNANSWERED_WARN_S + 1.5
    client = rlreplay.Client(f"127.0.0.1:{free_port()}", call_timeout=wait)
    with caplog.at_level("WARNING", logger="rlreplay"), pytest.raises(ServerUnavailableError):
        client.server_info()
    said = [r.getMessage() for r in caplog.records if "without a reply" in r.getMessage()]
    assert len(said) == 1 and "nothing accepts connections" in said[0], said
    assert "without a reply to the handshake before info" in said[0], said
    client.close()


def test_a_call_held_by_a_live_servers_limiter_does_not_say_the_server_is_missing(
    address, caplog
):
    fresh = rlreplay.Client(address, call_timeout=10.0)  # its first call: no reply before
    fresh.reset("ratio")
    fresh.insert("ratio", block(0, 3))  # the limiter's error buffer of 2 is spent
    with caplog.at_level("WARNING", logger="rlreplay"), pytest.raises(RateLimiterTimeoutError):
        fresh2 = rlreplay.Client(address, call_timeout=10.0)
        fresh2.insert("ratio", step(9), timeout=3.5)  # a new client's first call waits
    assert not [r for r in caplog.records if "without a reply" in r.getMessage()]
    fresh.close()
    fresh2.close()


def test_remote_rows_are_read_as_local_ones_tuple_values_and_ragged_lists_included():
    tables = config({"name": "pair", "signature": {"obs": {"0": "int64", "1": "float32"},
                                                   "r": "float32"}, "max_size": 16})  # fmt: skip
    with served(tables) as (address, _):
        client = rlreplay.Client(address, call_timeout=10.0)
        assert len(client.insert("pair", {"obs": (1, 2.5), "r": 0.0})) == 1  # one row
        batch = (np.array([3, 4]), np.array([0.5, 1.5], np.float32))
        assert len(client.insert("pair", {"obs": batch, "r": np.zeros(2)})) == 2
        assert sorted(client.sample("pair", 16, timeout=5.0).data["obs/0"].tolist())[:1] == [1]
        with pytest.raises(SignatureError, match="one array"):
            client.insert("pair", {"obs": (1, [2.0, [3.0]]), "r": 0.0})
        assert client.info("pair").size == 3
        client.close()


def test_a_call_to_a_server_killed_after_it_answered_says_so_while_it_waits(caplog):
    """A server that answered this socket before, then was killed: the wait still says,
    after UNANSWERED_WARN_S of silence, what it waits for and why the server is silent."""
    from rlreplay.net.client import transport

    with served(TABLES) as (addr, proc):
        client = rlreplay.Client(addr, call_timeout=transport.UNANSWERED_WARN_S + 1.5)
        client.server_info()
        proc.kill()
        proc.join(10.0)
        with caplog.at_level("WARNING", logger="rlreplay"), pytest.raises(ServerUnavailableError):
            client.server_info()
        said = [r.getMessage() for r in caplog.records if "without a reply" in r.getMessage()]
        assert len(said) == 1 and "nothing accepts connections" in said[0], said
        client.close()


def test_an_update_sent_without_waiting_to_a_missing_server_fails_within_the_grace():
    from rlreplay.net.client.transport import REPLY_GRACE_S

    client = rlreplay.Client(f"127.0.0.1:{free_port()}", call_timeout=30.0)
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError):
        client.update_priorities("gym", np.arange(3), 1.0, wait=False)
    assert time.monotonic() - start < REPLY_GRACE_S + 1.0  # not the call_timeout's 30 s
    client.close()


def test_closing_a_writer_whose_server_was_killed_takes_its_timeout_not_the_clients():
    with served(TABLES) as (addr, proc):
        client = rlreplay.Client(addr, call_timeout=30.0)
        writer = client.trajectory_writer("gym")
        writer.append(step(0))
        writer.create_item("gym", priority=1.0)
        proc.kill()
        proc.join(10.0)
        start = time.monotonic()
        with pytest.raises(ServerUnavailableError):
            writer.close(timeout=1.0)
        assert time.monotonic() - start < 4.0  # the flush's 1 s and the reply grace
        client.close()


def test_a_remote_writers_end_episode_after_close_raises_closed_error(address):
    client = rlreplay.Client(address, call_timeout=10.0)
    writer = client.trajectory_writer("gym")
    writer.close()
    with pytest.raises(ClosedError):
        writer.end_episode()
    client.close()
