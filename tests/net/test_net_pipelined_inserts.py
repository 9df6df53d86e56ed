"""Pipelined ``Client.insert``: rows go out without a round trip per call, every row is
stored once, a thread reads its own writes, and refused rows raise later, counted, never
stored. Real servers in their own processes on 127.0.0.1."""

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
from netprocs import config, served, wait_until_stopped

import rlreplay
from rlreplay.errors import (
    InvalidArgumentError,
    RateLimiterTimeoutError,
    ReplayTimeoutError,
    ServerUnavailableError,
    SignatureError,
)
from rlreplay.net import inserts

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
    """Every row of a uniform table (sampled until each was seen; bounded)."""
    seen: dict[int, tuple] = {}
    for _ in range(200):
        s = client.sample(table, 256, timeout=5.0)
        for k, o, a, r, d in zip(s.info.keys, s.data["obs"], s.data["action"],
                                 s.data["reward"], s.data["done"]):  # fmt: skip
            seen[int(k)] = (o.tolist(), int(a), float(r), bool(d))
        if len(seen) == n:
            break
    return seen


def test_single_rows_of_gymnasium_scalars_are_all_stored_once_and_flush_counts_them(client):
    n = 1500
    receipts = [client.insert("gym", step(i, np.float64 if i % 5 == 0 else np.float32))
                for i in range(n)]  # fmt: skip
    assert client.flush(timeout=10.0) <= n
    assert client.info("gym").size == n
    keys = np.concatenate([r.keys() for r in receipts])
    assert len(np.unique(keys)) == n and all(r.done() for r in receipts)
    rows = all_rows(client, "gym", n)
    assert len(rows) == n
    by_key = dict(zip(keys.tolist(), range(n)))
    for key, (obs, action, reward, done) in rows.items():
        i = by_key[key]  # each receipt's key names its own row
        assert (obs, action, reward, done) == ([float(i)] * 4, i % 3, float(i), i % 7 == 0)


def test_single_rows_are_coalesced_while_messages_are_in_flight(client):
    n = 600
    receipts = [client.insert("gym", step(i)) for i in range(n)]
    client.flush(timeout=10.0)
    batches = {id(r._batch) for r in receipts}
    # far fewer messages than rows, and none larger than a message may hold
    assert len(batches) < n / 2
    assert max(len(r._batch.keys) for r in receipts) <= inserts.MAX_BATCH_ROWS


def test_single_rows_are_held_while_one_insert_message_awaits_its_acknowledgement(client):
    """A row goes out at once only while no insert message is out; rows given while one
    is out travel together in the next message, so a server that answers quickly does
    not get a message per row (whose cost, not the rows', bounded the loop)."""
    client.insert("ratio", {k: np.stack([step(i)[k] for i in range(3)]) for k in GYM},
                  wait=True)  # the limiter admits no more until a sample: the next is parked
    cap = client._insert_plan("ratio", None).cap  # rows one message may hold here
    assert cap > 1
    first = client.insert("ratio", step(3), timeout=5.0)
    rest = [client.insert("ratio", step(4 + i), timeout=5.0) for i in range(cap)]
    assert first._batch.rid is not None  # sent at once
    assert len({id(r._batch) for r in rest}) == 1 and rest[0]._batch is not first._batch
    assert rest[0]._batch.rid is None  # held: nothing else was sent meanwhile
    for _ in range(50):  # samples admit the rest
        if client.info("ratio").size == 4 + cap:
            break
        client.sample("ratio", 1, timeout=5.0)
    client.flush(timeout=10.0)
    assert client.info("ratio").size == 4 + cap
    assert all(len(r.keys(timeout=1.0)) == 1 for r in [first, *rest])


def test_rows_given_soon_after_a_message_left_wait_for_the_next_one(client, monkeypatch):
    """Within COALESCE_S of the last message, rows are held even when it was already
    acknowledged (a quick server would otherwise get a message per row); after it, a
    row goes out at once."""
    monkeypatch.setattr(inserts, "COALESCE_S", 60.0)
    first = client.insert("gym", step(0))
    first.keys(timeout=5.0)  # acknowledged: nothing is in flight
    held = [client.insert("gym", step(1 + i)) for i in range(3)]
    assert len({id(r._batch) for r in held}) == 1 and held[0]._batch.rid is None
    assert client.flush(timeout=5.0) == 3  # flush sends them, as one message
    monkeypatch.setattr(inserts, "COALESCE_S", 0.0)
    client.insert("gym", step(4)).keys(timeout=5.0)
    assert client.insert("gym", step(5))._batch.rid is not None  # sent at once
    client.flush(timeout=5.0)
    assert client.info("gym").size == 6


def test_priorities_travel_with_their_rows(client):
    for i in range(40):
        client.insert("prio", step(i), priorities=1.0 if i == 17 else 0.0)
    batch = client.sample("prio", 64, timeout=5.0)  # the held rows go out first
    assert set(batch.data["reward"].tolist()) == {17.0}


def test_a_thread_reads_its_own_writes_without_flushing(client):
    for i in range(300):
        client.insert("gym", step(i))
    assert client.info("gym").size == 300  # rows held went out before this request


def test_batched_calls_and_single_rows_keep_their_order_and_keys(client):
    first = client.insert("gym", step(0))
    block = {k: np.stack([step(i)[k] for i in range(1, 11)]) for k in GYM}
    middle = client.insert("gym", block)
    last = client.insert("gym", step(11))
    keys = np.concatenate([first.keys(5.0), middle.keys(5.0), last.keys(5.0)])
    assert len(middle) == 10 and len(np.unique(keys)) == 12
    assert client.info("gym").size == 12


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
    "an unknown table": (lambda c: c.insert("nope", step(0)), InvalidArgumentError),
    "a bad timeout": (lambda c: c.insert("gym", step(0), timeout=-1), InvalidArgumentError),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_rows_are_refused_by_the_call_itself_and_nothing_is_taken(client, case):
    call, error = BAD_CALLS[case]
    client.insert("gym", step(0))
    with pytest.raises(error):
        call(client)
    assert client.flush(timeout=5.0) <= 1
    assert client.info("gym").size == 1 and client.info("prio").size == 0


def test_rows_the_limiter_refuses_raise_at_the_next_call_counted_and_are_never_stored(client):
    # the limiter admits 3 rows without samples: the first go in, the rest are refused
    receipts = [client.insert("ratio", step(i), timeout=0.3) for i in range(3)]
    for r in receipts:
        r.keys(timeout=5.0)
    # the first is sent at once, the second held while it is out (sent by flush)
    receipts += [client.insert("ratio", step(i), timeout=0.3) for i in range(2)]
    with pytest.raises(RateLimiterTimeoutError, match=r"2 row\(s\) of earlier insert calls"):
        client.flush(timeout=10.0)
    stored = [r for r in receipts if r._batch.keys is not None]
    refused = [r for r in receipts if r._batch.error is not None]
    assert (len(stored), len(refused)) == (3, 2)
    assert client.flush(timeout=5.0) == 0  # each error is raised once
    with pytest.raises(RateLimiterTimeoutError):
        refused[0].keys()  # ... and by the receipt that asks
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # never stored later
        assert client.info("ratio").size == len(stored)
        time.sleep(0.1)


def test_the_next_call_raises_what_the_server_refused_and_takes_nothing(client):
    client.insert("ratio", {k: np.stack([step(i)[k] for i in range(3)]) for k in GYM},
                  wait=True)  # the limiter admits no more
    # sent at once as one message (a batch axis), refused after 0.2 s
    client.insert("ratio", {k: np.stack([step(i)[k] for i in range(2)]) for k in GYM},
                  timeout=0.2)
    time.sleep(1.0)  # the refusal arrives meanwhile
    with pytest.raises(RateLimiterTimeoutError, match=r"2 row\(s\) of earlier insert"):
        client.insert("gym", step(0))
    assert client.info("gym").size == 0  # the call that raised took nothing
    assert client.info("ratio").size == 3
    assert client.flush(timeout=5.0) == 0  # raised once only


def test_flush_that_times_out_drops_nothing(client):
    for i in range(6):
        client.insert("ratio", step(i))  # no timeout: the limiter holds them
    with pytest.raises(ReplayTimeoutError) as caught:
        client.flush(timeout=0.3)
    assert not isinstance(caught.value, RateLimiterTimeoutError)
    held = client.info("ratio").size
    assert held < 6
    for _ in range(50):  # samples admit the rest
        if client.info("ratio").size == 6:
            break
        client.sample("ratio", 1, timeout=5.0)
    client.flush(timeout=10.0)
    assert client.info("ratio").inserts == 6


def test_acknowledgements_that_arrived_survive_a_dropped_socket():
    with served(TABLES) as (address, proc):
        client = rlreplay.Client(address, call_timeout=0.5, diagnose_timeout=0.0)
        receipts = [client.insert("gym", step(i)) for i in range(inserts.IN_FLIGHT)]
        time.sleep(0.5)  # sent at once, acknowledged, not yet read
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_until_stopped(proc.pid)
            with pytest.raises(ServerUnavailableError):
                client.info("gym")  # drops the socket
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        client.flush(timeout=5.0)  # nothing reported lost
        assert len(np.concatenate([r.keys() for r in receipts])) == inserts.IN_FLIGHT
        client.close()


def test_rows_in_flight_when_the_server_dies_raise_server_unavailable_from_flush():
    with served(TABLES) as (address, proc):
        client = rlreplay.Client(address, liveness_s=0.5, diagnose_timeout=0.0)
        client.insert("gym", step(0), wait=True)
        proc.kill()
        proc.join(10.0)
        for i in range(5):
            client.insert("gym", step(i))  # sent into the void: no wait here
        start = time.monotonic()
        with pytest.raises(ServerUnavailableError, match="not acknowledged"):
            client.flush(timeout=1.0)
        assert time.monotonic() - start < 5.0
        client.close(timeout=0.1)


def test_close_sends_the_rows_held(address):
    writer = rlreplay.Client(address)
    writer.reset("gym")
    for i in range(200):
        writer.insert("gym", step(i))
    writer.close()
    reader = rlreplay.Client(address)
    assert reader.info("gym").size == 200
    reader.close()


def test_leaving_a_with_block_by_an_error_does_not_wait_for_a_dead_server():
    with served(TABLES) as (address, proc):
        client = rlreplay.Client(address, call_timeout=20.0)
        client.insert("gym", step(0), wait=True)
        proc.kill()
        proc.join(10.0)
        start = time.monotonic()
        with pytest.raises(KeyError), client:
            client.insert("gym", step(1))  # never acknowledged
            raise KeyError("the caller's own error")
        assert time.monotonic() - start < 5.0


def test_a_process_that_exits_without_flushing_has_its_rows_sent(address):
    rlreplay.Client(address).reset("gym")
    code = (
        "import numpy as np, rlreplay\n"
        f"c = rlreplay.Client({address!r})\n"
        "for i in range(500):\n"
        "    c.insert('gym', {'obs': np.zeros(4, np.float32), 'action': i, 'reward': 0.5,"
        " 'done': False})\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=env)
    reader = rlreplay.Client(address)
    assert reader.info("gym").size == 500
    reader.close()


def insert_and_return(address: str, n: int) -> None:
    """Child: insert ``n`` rows and end without flushing."""
    c = rlreplay.Client(address)
    for i in range(n):
        c.insert("gym", step(i))


def test_a_multiprocessing_child_that_ends_without_flushing_has_its_rows_sent(address):
    from netprocs import CTX

    rlreplay.Client(address).reset("gym")
    proc = CTX.Process(target=insert_and_return, args=(address, 300))
    proc.start()
    proc.join(60.0)
    assert proc.exitcode == 0
    reader = rlreplay.Client(address)
    assert reader.info("gym").size == 300
    reader.close()


def test_a_receipt_is_waited_for_in_the_thread_that_inserted(client):
    receipt = client.insert("gym", step(0))
    caught: list = []
    t = threading.Thread(target=lambda: caught.append(_raises(receipt.keys)))
    t.start()
    t.join(10.0)
    assert caught and isinstance(caught[0], InvalidArgumentError)
    assert len(receipt.keys(5.0)) == 1


def _raises(fn):
    try:
        fn()
    except Exception as exc:
        return exc
    return None


def test_a_message_holds_no_more_rows_than_the_limiter_admits_at_once(client):
    plan = client._insert_plan("ratio", None)
    window = client.describe("ratio")["insert_window"]
    assert window is not None and plan.cap == window
    assert client._insert_plan("gym", None).cap == inserts.MAX_BATCH_ROWS


def test_a_refusal_collected_but_never_raised_is_logged_when_the_process_exits(client, address):
    # the receipt's done() reads the refusal of 2 rows sent at once (one call with a batch
    # axis); no later call raises it, so exit must
    code = (
        "import time, numpy as np, rlreplay\n"
        f"c = rlreplay.Client({address!r})\n"
        "row = {'obs': np.zeros(4, np.float32), 'action': 0, 'reward': 0.5, 'done': False}\n"
        "c.insert('ratio', {k: np.stack([v] * 3) for k, v in row.items()}, wait=True)\n"
        "r = [c.insert('ratio', {k: np.stack([v] * 2) for k, v in row.items()}, timeout=0.2)]\n"
        "deadline = time.monotonic() + 10.0\n"
        "while not r[-1].done() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "assert r[0].done() and r[-1].done()\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, "-c", code], timeout=60, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "2 row(s) of earlier insert calls to 'ratio' were not inserted" in done.stderr
    assert client.info("ratio").size == 3


def test_a_receipts_done_is_asked_in_the_thread_that_inserted(client):
    receipt = client.insert("gym", step(0))
    caught: list = []
    t = threading.Thread(target=lambda: caught.append(_raises(receipt.done)))
    t.start()
    t.join(10.0)
    assert caught and isinstance(caught[0], InvalidArgumentError)
    assert len(receipt.keys(5.0)) == 1 and receipt.done()


def test_leaving_a_with_block_by_an_error_logs_the_rows_it_dropped(address, caplog):
    client = rlreplay.Client(address, call_timeout=10.0)
    client.reset("ratio")
    client.insert("ratio", {k: np.stack([step(i)[k] for i in range(3)]) for k in GYM},
                  wait=True)  # the limiter admits no more: the next rows stay out
    with caplog.at_level("WARNING", logger="rlreplay.net"), pytest.raises(KeyError), client:
        for i in range(5):
            # 1 sent at once (parked), 3 held fill a message (the limiter's window) that
            # goes out as the second, 1 held
            client.insert("ratio", step(i))
        raise KeyError("the caller's own error")
    assert "dropped 1 inserted row(s) not yet sent and 4 sent" in caplog.text
    reader = rlreplay.Client(address)
    assert reader.info("ratio").size == 3
    reader.reset("ratio")  # the parked rows' calls end with it
    reader.close()
