"""The overwrite protocol under every interleaving hypothesis finds, in one thread.

Writers, one-row and batch inserts, item creation, episode ends and samples run in any
order over tables of every policy sharing a store, down to stores barely large enough.
After each call, whatever it raised, every table's size, live flags and selectors agree,
every writer's retained steps are its own consecutive steps, and every sampled window
holds consecutive steps of one writer's one episode.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from overwrite_checks import assert_consistent, check_window, make_tables

from rlreplay import StepStore, Table, TrajectoryWriter
from rlreplay.errors import InvalidArgumentError, ReplayTimeoutError

SIGNATURE = {"w": "int64", "e": "int64", "i": "int64"}
QUICK = 0.001  # seconds: a call that would block times out at once

OPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "append_batch", "item", "end", "insert", "sample"]),
        st.integers(0, 2),  # writer or table
        st.integers(1, 4),  # steps or batch size
    ),
    min_size=5,
    max_size=60,
)


def check_state(store: StepStore, tables: list[Table], writers: list) -> None:
    assert_consistent(tables)
    for w, (writer, marks) in enumerate(writers):
        ids = writer.episode_step_ids
        if ids:
            data = store.read(np.array(ids))
            assert (data["w"] == w).all(), (w, data)
            assert (np.diff(data["i"]) == 1).all(), (w, data)
            assert (data["e"] == marks["episode"]).all(), (w, data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policies=st.lists(st.sampled_from(["evict", "block", "relocate"]), min_size=1, max_size=3),
    span=st.integers(1, 3),
    writers=st.integers(1, 3),
    slack=st.integers(0, 6),
    ops=OPS,
)
def test_every_interleaving_keeps_the_overwrite_invariant(policies, span, writers, slack, ops):
    history = span + 1
    store = StepStore(SIGNATURE, capacity=writers * history + span * len(policies) + slack)
    tables = make_tables(store, policies, span, size=2)
    rows = Table("rows", store=store, max_size=min(4, store.capacity))
    state = [
        (TrajectoryWriter(tables, history=history), {"episode": 0, "next": 0})
        for _ in range(writers)
    ]
    marks_rows = {"next": 0}
    for op, who, n in ops:
        writer, marks = state[who % writers]
        w = who % writers
        try:
            if op == "append":
                step = {"w": np.int64(w), "e": np.int64(marks["episode"]), "i": np.int64(0)}
                step["i"] = np.int64(marks["next"])
                writer.append(step, timeout=QUICK)
                marks["next"] += 1
            elif op == "append_batch":
                first = marks["next"]
                batch = {
                    "w": np.full(n, w, np.int64),
                    "e": np.full(n, marks["episode"], np.int64),
                    "i": np.arange(first, first + n, dtype=np.int64),
                }
                writer.append_batch(batch, timeout=QUICK)
                marks["next"] += n
            elif op == "item":
                if len(writer.episode_step_ids) >= span:
                    writer.create_item(tables[who % len(tables)], timeout=QUICK)
            elif op == "end":
                writer.end_episode()
                marks["episode"] += 1
                marks["next"] = 0
            elif op == "insert":
                k = min(n, rows.max_size)
                first = marks_rows["next"]
                batch = {
                    "w": np.full(k, 99, np.int64),
                    "e": np.full(k, first, np.int64),
                    "i": np.arange(first, first + k, dtype=np.int64),
                }
                rows.insert(batch, timeout=QUICK)
                marks_rows["next"] += k
            else:
                table = [*tables, rows][who % (len(tables) + 1)]
                if table.can_sample(1):
                    data = table.sample(1, timeout=QUICK).data
                    if table is rows:
                        assert (data["w"] == 99).all()
                    else:
                        check_window(data)
        except ReplayTimeoutError:
            if op in ("append", "append_batch"):  # nothing was appended: a fresh episode
                writer.end_episode()
                marks["episode"] += 1
                marks["next"] = 0
        except InvalidArgumentError as exc:
            expected = (
                "cannot hold the steps writers retain",
                "already holds an item anchored",
                "append between 1 and",  # a batch larger than the store
            )
            assert any(text in str(exc) for text in expected), exc
            if op in ("append", "append_batch"):
                writer.end_episode()
                marks["episode"] += 1
                marks["next"] = 0
        check_state(store, [*tables, rows], state)
