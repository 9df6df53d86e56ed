"""Error messages name what the user passed and say what to do, on one bounded line.

- ``max_size`` is checked before it becomes the store's capacity, so its error names
  ``max_size``, not ``capacity`` or ``lanes`` the user never gave;
- ``insert`` given a tuple (or one array) says it takes a mapping of field name -> array,
  without a multi-line array repr;
- ``describe`` gives one line of bounded length for any value;
- a timeout carries the same likely cause as the warning of a long-blocked call ("no
  sampler is consuming this queue", ...), since a timeout shorter than ``warn_after``
  never shows that warning.
"""

from __future__ import annotations

import numpy as np
import pytest

import rlreplay
from rlreplay import ItemLayout, StepStore, Table, TrajectoryWriter
from rlreplay.errors import (
    InvalidArgumentError,
    RateLimiterTimeoutError,
    ReplayTimeoutError,
    SignatureError,
    describe,
)

SIG = {"obs": ((4,), "float32"), "act": "int64", "rew": "float32"}


def one_line(message: str, limit: int = 300) -> None:
    assert "\n" not in message and len(message) <= limit, message


def row(i: int = 0) -> dict[str, np.ndarray]:
    return {
        "obs": np.full(4, i, np.float32),
        "act": np.int64(i),
        "rew": np.float32(i),
    }


@pytest.mark.parametrize("max_size", [0, -3, 2.5, True, 2**31, "8"])
def test_a_bad_max_size_is_named_as_max_size(max_size):
    with pytest.raises(InvalidArgumentError) as err:
        Table("t", signature=SIG, max_size=max_size)
    message = str(err.value)
    assert message.startswith(f"max_size={max_size!r} must be a positive int")
    assert "capacity=" not in message.split("unless")[0] and "lanes" not in message
    one_line(message)


def test_max_size_with_a_capacity_is_still_checked_against_it():
    with pytest.raises(InvalidArgumentError, match=r"max_size=0 must be an int in \[1, 4\]"):
        Table("t", signature=SIG, capacity=4, max_size=0)
    with pytest.raises(InvalidArgumentError, match=r"max_size=True must be an int"):
        Table("t", signature=SIG, capacity=4, max_size=True)


@pytest.mark.parametrize(
    "rows",
    [
        (np.zeros((2, 4), np.float32), np.zeros(2, np.int64), np.zeros(2, np.float32)),
        [np.zeros((50, 4), np.float32)],
        np.zeros((30, 4), np.float32),
    ],
    ids=["tuple", "list", "array"],
)
def test_insert_of_something_other_than_a_mapping_says_what_insert_takes(rows):
    table = Table("t", signature=SIG, max_size=8)
    table.insert(row())
    before = table.info().to_dict()
    with pytest.raises(SignatureError) as err:
        table.insert(rows)
    message = str(err.value)
    assert message.startswith("insert takes rows as a mapping of field name -> array")
    assert "'obs': ..., 'act': ..., 'rew': ..." in message and "'t'" in message
    one_line(message, 200)
    assert table.info().to_dict() == before and table.store.next_id == 1


@pytest.mark.parametrize(
    "value",
    [
        np.zeros((3, 4)),
        np.zeros((100, 100)),
        (np.zeros((2, 4)), np.zeros(2)),
        "x\ny" * 50,
        {"a": np.ones((5, 5))},
        list(range(100)),
    ],
)
def test_describe_is_one_line_of_bounded_length(value):
    text = describe(value)
    assert "\n" not in text and len(text) <= 60, text
    assert len(describe(value, limit=30)) <= 30


def test_describe_names_a_large_array_by_its_shape_and_dtype():
    assert describe(np.zeros((100, 100), np.float32)) == "ndarray of shape (100, 100), float32"
    assert describe((np.zeros((2, 4), np.float32),) * 3) == (
        "tuple of 3 values, first ndarray of shape (2, 4), float32"
    )
    assert describe([1, 2]) == "[1, 2]"


def test_an_insert_timeout_on_a_full_queue_gives_the_likely_cause():
    queue = Table.queue("q", 3, signature=SIG)
    for i in range(3):
        queue.insert(row(i))
    with pytest.raises(RateLimiterTimeoutError) as err:
        queue.insert(row(3), timeout=0.05)
    message = str(err.value)
    assert "no sampler is consuming this queue" in message and "'q'" in message
    one_line(message)
    assert len(queue) == 3


def test_a_sample_timeout_on_an_empty_table_gives_the_likely_cause():
    table = Table("t", signature=SIG, max_size=8)
    with pytest.raises(RateLimiterTimeoutError, match="no writer is inserting") as err:
        table.sample(2, timeout=0.05)
    one_line(str(err.value))


def test_a_store_wait_timeout_gives_the_likely_cause():
    store = StepStore(SIG, 4)
    queue = Table.queue("q", 4, store=store)
    other = Table("u", store=store, max_size=4)
    for i in range(4):
        queue.insert(row(i))
    with pytest.raises(ReplayTimeoutError) as err:
        other.insert(row(9), timeout=0.05)
    message = str(err.value)
    assert "no sampler is consuming that queue" in message and "'q'" in message
    one_line(message)
    assert len(queue) == 4 and len(other) == 0


def transition_table() -> Table:
    store = StepStore(SIG, 16)
    return Table("tr", store=store, layout=ItemLayout.transition(store.signature), max_size=8)


TOO_FEW = (
    "an item of table 'tr' needs 2 steps of this episode; it has 1 "
    "(call create_item after the next append)"
)


def test_create_item_too_early_says_how_many_steps_the_item_needs():
    table = transition_table()
    writer = TrajectoryWriter(table)
    with pytest.raises(InvalidArgumentError) as err:
        writer.create_item(table)  # no step yet
    assert "needs 2 steps of this episode; it has 0 (call create_item after 2 more" in str(
        err.value
    )
    writer.append(row(0))
    with pytest.raises(InvalidArgumentError) as err:
        writer.create_item(table)
    assert str(err.value) == TOO_FEW and "start" not in str(err.value)
    with pytest.raises(InvalidArgumentError, match=r"start=-2 reaches back 2 steps"):
        writer.create_item(table, start=-2)  # a start the user gave is named
    writer.append(row(1))
    writer.create_item(table)
    assert len(table) == 1


def test_the_remote_writer_says_the_same():
    table = transition_table()
    with rlreplay.Server([table], bind="127.0.0.1") as server:
        client = rlreplay.Client(server.address, call_timeout=10)
        try:
            writer = client.trajectory_writer("tr")
            writer.append(row(0))
            with pytest.raises(InvalidArgumentError) as err:
                writer.create_item("tr")
            assert str(err.value) == TOO_FEW
            writer.append(row(1))
            writer.create_item("tr")
            writer.close(timeout=10)
            assert len(table) == 1
        finally:
            client.close()


@pytest.mark.parametrize("priorities", ["high", [[1.0], [2.0, 3.0]], {"p": 1.0}])
def test_priorities_that_are_not_numbers_are_an_invalid_argument_naming_them(priorities):
    table = Table("t", signature=SIG, max_size=8, sampler=rlreplay.Prioritized(0.6))
    rows = {"obs": np.zeros((2, 4), np.float32), "act": np.zeros(2, np.int64),
            "rew": np.zeros(2, np.float32)}  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="priorities must be a number") as info:
        table.insert(rows, priorities=priorities)
    one_line(str(info.value))
    assert table.size == 0 and table.store.next_id == 0
