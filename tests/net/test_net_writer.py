"""The remote writer stores exactly what a local TrajectoryWriter stores for the same calls."""

from __future__ import annotations

import numpy as np
import pytest
from netprocs import config, served

import rlreplay
from rlreplay import Fifo, ItemLayout, StepStore, Table, TrajectoryWriter
from rlreplay.errors import InvalidArgumentError, RateLimiterTimeoutError

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
