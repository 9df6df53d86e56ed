"""The compiled one-step write (put_row) against the validated Python path of the store.

Each case inserts one row into two identical tables, one writing through the kernel and
one with it switched off: what is stored, the keys and any error must be the same.
Skipped when the extension is not built or is turned off with ``RLREPLAY_NO_EXTENSION=1``.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import Table
from rlreplay.core import storage
from rlreplay.errors import SignatureError

kernel = pytest.importorskip("rlreplay.core._store")
if storage._kernel is None:
    pytest.skip("RLREPLAY_NO_EXTENSION is set", allow_module_level=True)

SIGNATURE = {
    "obs": ((3,), "float32"),
    "count": "int64",
    "reward": "float32",
    "gamma": "float64",
    "done": "bool",
    "frame": ((2, 2), "uint8"),
}


def good_row(**changes) -> dict:
    row = {
        "obs": np.array([1.5, -2.0, 3.25], np.float32),
        "count": 7,
        "reward": 0.1,
        "gamma": 0.99,
        "done": False,
        "frame": np.arange(4, dtype=np.uint8).reshape(2, 2),
    }
    row.update(changes)
    return row


ROWS = {
    "exact": good_row(),
    "numpy-scalars": good_row(reward=np.float32(0.5), count=np.int64(3), done=np.bool_(True)),
    "zero-d-arrays": good_row(reward=np.array(0.5, np.float32), count=np.array(9)),
    "int-into-float": good_row(reward=3, gamma=-1),
    "float64-array-into-float32": good_row(obs=np.array([0.1, 0.2, 0.3])),
    "int32-array-into-int64": good_row(count=np.array(5, np.int32)),
    "strided-array": good_row(obs=np.arange(6, dtype=np.float32)[::2]),
    "list": good_row(obs=[1.0, 2.0, 3.0]),
    "bool-true": good_row(done=True),
    "big-int": good_row(count=2**62),
}
BAD_ROWS = {
    "wrong-shape": good_row(obs=np.zeros(4, np.float32)),
    "wrong-kind": good_row(count=1.5),
    "float-into-bool": good_row(done=0.5),
    "int-too-big": good_row(count=2**70),
    "missing-field": {k: v for k, v in good_row().items() if k != "gamma"},
    "extra-field": good_row(extra=1.0),
    "string": good_row(reward="high"),
    "frame-wrong-dtype": good_row(frame=np.zeros((2, 2), np.float32)),
}


def pair(capacity: int = 4) -> tuple[Table, Table]:
    # One name and seed: one key origin, so both tables issue the same keys.
    fast = Table("t", signature=SIGNATURE, max_size=capacity, seed=0)
    slow = Table("t", signature=SIGNATURE, max_size=capacity, seed=0)
    slow.store.compiled_writes = False
    assert fast.store.compiled_writes
    return fast, slow


def assert_same_store(a: Table, b: Table) -> None:
    for path in a.store.columns:
        np.testing.assert_array_equal(a.store.columns[path], b.store.columns[path], path)
    assert a.store.next_id == b.store.next_id
    assert a.info().size == b.info().size


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_rows_are_stored_alike_with_and_without_the_kernel(row):
    fast, slow = pair()
    for _ in range(6):  # past the capacity: the ring wraps and items are evicted
        np.testing.assert_array_equal(fast.insert(row), slow.insert(row))
    assert_same_store(fast, slow)
    assert len(fast) == 4


@pytest.mark.parametrize("row", BAD_ROWS.values(), ids=BAD_ROWS.keys())
def test_bad_rows_raise_the_same_error_and_change_nothing(row):
    fast, slow = pair()
    for t in (fast, slow):
        t.insert(good_row())
        t.insert(good_row(count=8))
    errors = []
    for t in (fast, slow):
        with pytest.raises((SignatureError, ValueError, TypeError, OverflowError)) as info:
            t.insert(row)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]
    assert_same_store(fast, slow)
    assert fast.info().inserts == 2


def batch(n: int, **changes) -> dict:
    rows = {
        k: np.stack([np.asarray(v)] * n) if not isinstance(v, np.ndarray) else np.stack([v] * n)
        for k, v in good_row().items()
    }
    rows["count"] = np.arange(n, dtype=np.int64)
    rows["reward"] = rows["reward"].astype(np.float32)
    rows.update(changes)
    return rows


BATCHES = {
    "exact": batch(3),
    "castable": batch(3, obs=np.ones((3, 3)), count=np.arange(3, dtype=np.int32)),
    "strided": batch(3, obs=np.ones((6, 3), np.float32)[::2]),
    "one-row-batch": batch(1),
}
BAD_BATCHES = {
    "lengths-differ": batch(3, count=np.arange(2)),
    "wrong-row-shape": batch(3, obs=np.ones((3, 4), np.float32)),
    "wrong-kind": batch(3, count=np.ones(3)),
    "missing-field": {k: v for k, v in batch(3).items() if k != "done"},
    "scalar-for-batch": batch(3, reward=1.0),
}


@pytest.mark.parametrize("rows", BATCHES.values(), ids=BATCHES.keys())
def test_batches_are_stored_alike_with_and_without_the_kernel(rows):
    fast, slow = pair(capacity=8)
    for _ in range(5):  # 3 rows at a time into 8: some batches wrap around the ring
        np.testing.assert_array_equal(fast.insert(rows), slow.insert(rows))
        assert_same_store(fast, slow)


@pytest.mark.parametrize("rows", BAD_BATCHES.values(), ids=BAD_BATCHES.keys())
def test_bad_batches_raise_the_same_error_and_change_nothing(rows):
    fast, slow = pair(capacity=8)
    for t in (fast, slow):
        t.insert(batch(3))
    errors = []
    for t in (fast, slow):
        with pytest.raises((SignatureError, ValueError, TypeError)) as info:
            t.insert(rows)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]
    assert_same_store(fast, slow)
    assert fast.info().inserts == 3


def test_a_queue_or_stack_on_the_store_turns_the_write_before_the_hand_over_off():
    """Only a table alone on its store and evicting writes rows before the overwrite
    protocol has handed them over (it replaces its own items there)."""
    for ordered in (
        Table.queue("q", 4, signature=SIGNATURE),
        Table.stack("s", 4, signature=SIGNATURE),
    ):
        assert ordered.store.overwrite.sole is None
    plain = Table("t", signature=SIGNATURE, max_size=4)
    assert plain.store.overwrite.sole is plain.store_ref


def test_put_row_checks_its_columns_and_row():
    cols = (np.zeros((3, 2), np.float32),)
    with pytest.raises(ValueError, match="outside"):
        kernel.put_row(np.ndarray, cols, ("a",), 3, {"a": np.zeros(2, np.float32)})
    strided = np.zeros((3, 2))[:, ::2]  # a column it cannot write: not handled, no error
    assert not kernel.put_row(np.ndarray, (strided,), ("a",), 0, {"a": 1.0})
    assert not strided.any()
    assert not kernel.put_row(np.ndarray, cols, ("a",), 0, {"b": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="outside"):
        kernel.put_rows(np.ndarray, cols, ("a",), 2, 2, {"a": np.zeros((2, 2), np.float32)})
    assert not cols[0].any()


def test_one_row_inserts_between_deletes_and_samples_match_the_general_path():
    """A table alone on its store takes a shorter path for one row; with a max_size below
    the capacity, deletes and max_times_sampled, it must end where the general path does."""
    tables = []
    for compiled in (True, False):
        t = Table("t", signature=SIGNATURE, capacity=8, max_size=5, max_times_sampled=2, seed=1)
        t.store.compiled_writes = compiled
        tables.append(t)
    rng = np.random.default_rng(3)
    for step in range(200):
        action = rng.random()
        results = []
        for t in tables:
            if action < 0.6 or len(t) == 0:
                results.append(t.insert(good_row(count=step)).tolist())
            elif action < 0.8:
                results.append(t.delete(t.sample(2).info.keys))
            else:
                results.append(t.sample(3).info.keys.tolist())
        assert results[0] == results[1]
        assert_same_store(*tables)
        a, b = (t.info() for t in tables)
        assert a == b
        np.testing.assert_array_equal(tables[0].index.slot_state, tables[1].index.slot_state)


# A remote writer buffers its steps through the same compiled write.


def step_buffers():
    from rlreplay.core.specs import Signature
    from rlreplay.net.client.writer.steps import StepBuffer

    fast, slow = (StepBuffer(Signature(SIGNATURE), 4) for _ in range(2))
    slow.compiled_writes = False
    assert fast.compiled_writes
    return fast, slow


@pytest.mark.parametrize("case", sorted(ROWS))
def test_a_remote_writer_buffers_a_step_as_its_checked_path_does(case):
    fast, slow = step_buffers()
    for buffer in (fast, slow):
        buffer.add(good_row())
        buffer.add(ROWS[case])
    a, b = fast.take([]), slow.take([])
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and len(a[name]) == 2, name
        np.testing.assert_array_equal(a[name], b[name], name)


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_remote_writer_refuses_a_bad_step_as_its_checked_path_does(case):
    fast, slow = step_buffers()
    errors = []
    for buffer in (fast, slow):
        buffer.add(good_row())
        with pytest.raises(SignatureError) as info:
            buffer.add(BAD_ROWS[case])
        errors.append(str(info.value))
        assert buffer.n == 1  # nothing of the refused step was taken
    assert errors[0] == errors[1]


def test_a_remote_writer_chunk_holds_no_more_memory_than_its_steps():
    fast, _ = step_buffers()
    for _ in range(3):
        fast.add(good_row())
    partial = fast.take([])
    assert all(len(a) == 3 and a.base is None for a in partial.values())  # own copies
    for _ in range(4):
        fast.add(good_row())
    full = fast.take([])
    fast.add(good_row(count=99))  # the next chunk's rows are new arrays
    assert int(full["data/count"][0]) == 7 and fast.n == 1
    assert fast.take([])["data/count"].tolist() == [99]
    assert all(len(a) == 0 for a in fast.take([]).values())
