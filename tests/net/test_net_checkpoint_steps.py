"""A server takes a checkpoint's capture a step at a time between requests: clients'
calls are answered while a large index is copied, and the checkpoint still holds
exactly the state at its moment (its last step), writer streams included."""

from __future__ import annotations

import threading
import time

import numpy as np
from checkpoint_procs import CTX, check_checkpoint, kill
from checkpoint_steps_procs import PRIO_ALPHA, prio_priority, serve_sliced

import rlreplay
from benchmarks.crash_trials import write_loop
from rlreplay.checkpoint import restore
from rlreplay.checkpoint.restore import load
from rlreplay.datasets.table_contents import read_items, step_range
from rlreplay.runtime.stop_flag import StopFlag

ITEMS = 150_000
BUDGET_S = 60.0


class Calls:
    """One client thread's calls: ``(sent, answered)`` in ``time.time()``, errors."""

    def __init__(self) -> None:
        self.times: list[tuple[float, float]] = []
        self.errors: list[BaseException] = []

    def timed(self, call, *args, **kwargs):
        sent = time.time()
        out = call(*args, **kwargs)
        self.times.append((sent, time.time()))
        return out


def inserter(address: str, stop: threading.Event, calls: Calls, acked: list[int]) -> None:
    """One row per call, waiting for each acknowledgement: ``i`` = ITEMS, ITEMS + 1, ..."""
    client = rlreplay.Client(address, call_timeout=10.0)
    end = time.monotonic() + BUDGET_S
    try:
        i = ITEMS
        while not stop.is_set() and time.monotonic() < end:
            calls.timed(client.insert, "prio", {"i": np.int64(i)}, float(prio_priority(i)))
            acked.append(i)
            i += 1
    except BaseException as exc:
        calls.errors.append(exc)
    finally:
        client.close()


def learner(address: str, stop: threading.Event, calls: Calls) -> None:
    """Sample 16 items, set their priorities anew."""
    client = rlreplay.Client(address, call_timeout=10.0)
    rng = np.random.default_rng(3)
    end = time.monotonic() + BUDGET_S
    try:
        while not stop.is_set() and time.monotonic() < end:
            s = calls.timed(client.sample, "prio", 16, timeout=5.0)
            calls.timed(client.update_priorities, "prio", s.info.keys, rng.uniform(0.1, 3, 16))
    except BaseException as exc:
        calls.errors.append(exc)
    finally:
        client.close()


def test_a_server_serves_between_the_capture_steps_and_saves_exactly_its_moment(tmp_path):
    out, child_stop = CTX.Queue(), StopFlag(CTX)
    proc = CTX.Process(
        target=serve_sliced, args=(ITEMS, str(tmp_path), 4096, out, child_stop), daemon=True
    )
    proc.start()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        started = out.get(timeout=60.0)
        assert started[0] == "ok", started
        address = started[1]
        ins, learn, acked = Calls(), Calls(), []
        written: list = []
        threads = [
            threading.Thread(target=inserter, args=(address, stop, ins, acked)),
            threading.Thread(target=learner, args=(address, stop, learn)),
            threading.Thread(
                # Fewer steps than ``seq`` holds items (max_size 100,000): a loaded
                # machine's slow checkpoint then still finds every acknowledged item.
                target=lambda: written.append(write_loop(address, 1, 90_000, BUDGET_S, stop))
            ),
        ]
        for t in threads:
            t.start()
        end = time.monotonic() + 30.0
        while (len(acked) < 50 or len(learn.times) < 20) and time.monotonic() < end:
            time.sleep(0.01)
        client = rlreplay.Client(address, call_timeout=10.0)
        acked_before = len(acked)
        path = client.checkpoint(timeout=60.0)
        sent_before_reply = len(acked) + 1  # at most one more insert was in flight
        time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(30.0)
        client.close()
        child_stop.set()
        stats = out.get(timeout=30.0)
    finally:
        stop.set()
        child_stop.set()
        for t in threads:
            t.join(30.0)
        kill(proc)

    assert not ins.errors and not learn.errors, (ins.errors, learn.errors)
    assert written and written[0][0] == "ok", written
    assert stats["saved"] == 1 and stats["failures"] == 0, stats
    assert stats["capture_steps"] >= 20, stats  # a small slice: many steps

    # Requests were answered between the steps: calls sent after the capture began and
    # answered before its moment (a dispatcher that copied the index in one go answers
    # none of them in that window).
    began = stats["capture_began_unix"]
    moment = load(tmp_path / path.rsplit("/", 1)[-1], False, None, False).manifest["created_unix"]
    assert began < moment
    inside = [c for c in ins.times + learn.times if began < c[0] and c[1] < moment]
    assert inside, (moment - began, stats)
    slowest = max(b - a for a, b in ins.times + learn.times)
    assert slowest < 5.0, slowest  # every call answered, none held up for long

    # The checkpoint holds exactly its moment: the pre-filled rows and a prefix of the
    # inserted ones, at least those acknowledged before the request; every sample
    # counted in both the items and the limiter; the sampler's trees match the
    # priorities; the writer's items consistent and none acknowledged before it missing.
    tables = restore(path)
    prio = tables["prio"]
    records = read_items(prio, step_range(prio.store, None, None))
    got = np.sort(prio.store.read(records.anchor_ids)["i"])
    inserted = len(got) - ITEMS
    assert acked_before <= inserted <= sent_before_reply, (acked_before, inserted)
    np.testing.assert_array_equal(got, np.arange(ITEMS + inserted))
    index = prio.index
    state = index.state()
    assert prio.rate_limiter.inserts == prio.size == len(got)
    assert prio.rate_limiter.samples == int(state["times_sampled"].sum()) > 0
    np.testing.assert_array_equal(index.sampler.held, index.live)
    leaves = index.sampler.sums.levels[0][: index.capacity]
    np.testing.assert_allclose(
        leaves, np.where(index.live, index.priority**PRIO_ALPHA, 0.0), rtol=1e-12
    )
    writer = check_checkpoint(path, {1: written[0][2]})
    assert writer["bad"] == writer["duplicates"] == writer["missing"] == 0, writer
    assert writer["acked_before"] > 0, writer


def test_a_server_stopped_during_a_capture_gives_it_up_and_its_tables_save_again(
    tmp_path, monkeypatch
):
    """Stopping between two capture steps: the index stops noting changed slots (else it
    would note them forever and refuse every later save of it), nothing is published,
    and the table saves in process afterwards."""
    from rlreplay.checkpoint import snapshot
    from rlreplay.net.server import checkpoints

    monkeypatch.setattr(snapshot, "SLICED_ABOVE_BYTES", 0)
    monkeypatch.setattr(snapshot, "SLICE_BYTES", 64)
    monkeypatch.setattr(checkpoints, "STEP_S", 0.0)  # one step per dispatcher turn
    table = rlreplay.Table(
        "t", signature={"x": "float32"}, max_size=50_000, sampler=rlreplay.Prioritized(0.6)
    )
    table.insert({"x": np.zeros(20_000, np.float32)})
    server = rlreplay.Server([table], checkpoint_dir=tmp_path / "served", checkpoint_every_s=0.01)
    server.start()
    try:
        end = time.monotonic() + 20.0
        while not table.index.changes.tracking and time.monotonic() < end:
            time.sleep(0.001)
        assert server.checkpoints.capturing and table.index.changes.tracking
    finally:
        server.stop()
    assert not table.index.changes.tracking
    assert table.store.observers == ()
    assert server.checkpoints.failures == 0 and server.checkpoints.saved == 0
    assert not rlreplay.checkpoint.list_checkpoints(tmp_path / "served")
    table.insert({"x": np.ones(5, np.float32)})
    saved = rlreplay.checkpoint.save(table, tmp_path / "local")
    restored = rlreplay.checkpoint.restore(saved)[table.name]
    assert restored.size == table.size == 20_005
