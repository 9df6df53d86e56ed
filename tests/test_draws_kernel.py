"""The compiled draw loops (gather, mark_sampled) against the numpy path of DrawPlan.

Two tables get the same steps, items and seed; one samples through the kernel, the other
with the kernel switched off. Their samples must be identical, field by field. Skipped when
the extension is not built or is turned off with ``RLREPLAY_NO_EXTENSION=1``.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import ItemLayout, Prioritized, StepStore, Table
from rlreplay.core import item_draws
from rlreplay.core.keys import make_keys
from rlreplay.core.table import SLOT_STATE

kernel = pytest.importorskip("rlreplay.core._draws")
if item_draws._kernel is None:
    pytest.skip("RLREPLAY_NO_EXTENSION is set", allow_module_level=True)

SIGNATURE = {
    "obs": ((3, 2), "float32"),
    "action": "int64",
    "reward": "float32",
    "flag": "bool",
    "pixel": ((5,), "uint8"),
}
CAPACITY = 40


def steps(first: int, n: int) -> dict[str, np.ndarray]:
    """``n`` steps whose every field encodes the step id (so a wrong row shows)."""
    ids = np.arange(first, first + n)
    return {
        "obs": (ids[:, None, None] + np.arange(6).reshape(1, 3, 2) / 10).astype(np.float32),
        "action": ids.astype(np.int64),
        "reward": (ids * 0.5).astype(np.float32),
        "flag": ids % 3 == 0,
        "pixel": ((ids[:, None] + np.arange(5)) % 256).astype(np.uint8),
    }


def layouts(signature) -> dict[str, ItemLayout]:
    return {
        "rows": ItemLayout.rows(signature),
        "transition": ItemLayout.transition(signature),
        "n-step-3": ItemLayout.transition(signature, n_step=3),
        "sequence-4": ItemLayout.sequence(signature, 4),
    }


def filled_pair(layout_name: str, lanes: int, max_times_sampled: int = 0, sampler=None):
    """Two identical tables over identical stores whose ring has wrapped (``sampler``: a
    function making each table's sampler; uniform tables keep 8-byte slot records,
    prioritized ones 16-byte records with the priority)."""
    tables = []
    for _ in range(2):
        store = StepStore(SIGNATURE, CAPACITY, lanes=lanes)
        layout = layouts(store.signature)[layout_name]
        table = Table(
            "t",
            store=store,
            layout=layout,
            seed=7,
            max_times_sampled=max_times_sampled,
            sampler=None if sampler is None else sampler(),
        )
        first = 0
        for n in (24, 24, 16):  # 64 steps into a ring of 40: the newest rows wrap
            store.append(steps(first, n))
            first += n
            anchors = np.arange(store.oldest_id, store.next_id - (layout.span - 1) * lanes)
            fresh = anchors[~table.index.live[anchors % CAPACITY]]
            table.create_items(fresh)
        if sampler is not None:  # priorities that tell the items apart
            slots = np.flatnonzero(table.index.live)
            keys = make_keys(slots, table.index.generation[slots], table.index.origin)
            table.update_priorities(keys, 1.0 + slots % 7)
        tables.append(table)
    return tables


def assert_same_sample(a, b) -> None:
    assert a.data.keys() == b.data.keys()
    for name in a.data:
        assert a.data[name].dtype == b.data[name].dtype
        np.testing.assert_array_equal(a.data[name], b.data[name], err_msg=name)
    for field in ("keys", "probabilities", "priorities", "times_sampled"):
        np.testing.assert_array_equal(getattr(a.info, field), getattr(b.info, field))


SAMPLERS = {"uniform": None, "prioritized": lambda: Prioritized(0.6)}


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("layout_name", ["rows", "transition", "n-step-3", "sequence-4"])
def test_kernel_samples_equal_numpy_samples(layout_name, lanes, sampler, monkeypatch):
    fast, slow = filled_pair(layout_name, lanes, sampler=SAMPLERS[sampler])
    for batch in (1, 5, 40):  # 40 draws from fewer items: slots repeat within a batch
        a = fast.sample(batch)
        with monkeypatch.context() as m:
            m.setattr(item_draws, "_kernel", None)
            b = slow.sample(batch)
        assert_same_sample(a, b)
    np.testing.assert_array_equal(fast.index.times_sampled, slow.index.times_sampled)


def test_kernel_counts_repeated_draws_in_batch_order(monkeypatch):
    fast, slow = filled_pair("rows", 1, max_times_sampled=3)
    for _ in range(4):
        a = fast.sample(16)
        with monkeypatch.context() as m:
            m.setattr(item_draws, "_kernel", None)
            b = slow.sample(16)
        assert_same_sample(a, b)
        assert (a.info.times_sampled <= 3).all()
    assert len(fast) == len(slow)


def test_sampled_data_are_the_stored_steps_at_each_window():
    (table, _) = filled_pair("sequence-4", 1)
    sample = table.sample(32)
    slots = sample.info.keys & 0xFFFFFFFF
    rows = (slots[:, None] + np.arange(4)) % CAPACITY
    for name, column in table.store.columns.items():
        np.testing.assert_array_equal(sample.data[name], column[rows])


def column_arrays():
    src = np.arange(40, dtype=np.float32).reshape(10, 4)
    return src, np.array([1, 3, 9], dtype=np.int64), np.zeros((3, 4), np.float32)


READONLY_OUT = np.frombuffer(bytes(48), np.float32).reshape(3, 4)
BAD_GATHERS = {
    "not-tuples": (lambda s, r, o: ([s], [r], [o]), TypeError),
    "lengths-differ": (lambda s, r, o: ((s,), (r, r), (o,)), ValueError),
    "row-out-of-range": (lambda s, r, o: ((s,), (np.array([1, 10, 2]),), (o,)), ValueError),
    "row-negative": (lambda s, r, o: ((s,), (np.array([-1, 0, 2]),), (o,)), ValueError),
    "rows-int32": (lambda s, r, o: ((s,), (r.astype(np.int32),), (o,)), TypeError),
    "rows-strided": (lambda s, r, o: ((s,), (np.repeat(r, 2)[::2],), (o,)), TypeError),
    "out-too-short": (lambda s, r, o: ((s,), (r,), (o[:2],)), ValueError),
    "out-row-bytes": (lambda s, r, o: ((s,), (r,), (np.zeros((3, 2), np.float32),)), ValueError),
    "out-readonly": (lambda s, r, o: ((s,), (r,), (READONLY_OUT,)), TypeError),
}


@pytest.mark.parametrize("make, error", BAD_GATHERS.values(), ids=BAD_GATHERS.keys())
def test_gather_rejects_bad_buffers_and_writes_nothing(make, error):
    src, rows, out = column_arrays()
    args = make(src, rows, out)
    with pytest.raises(error):
        kernel.gather(*args)
    assert not out.any()


def test_mark_sampled_rejects_a_slot_outside_the_table_and_writes_nothing():
    state = np.zeros(8, dtype=SLOT_STATE)
    state["generation"] = 1
    keys, prios, t_out = np.zeros(2, np.int64), np.zeros(2), np.zeros(2, np.uint32)
    with pytest.raises(ValueError, match="outside the table"):
        kernel.mark_sampled(np.array([2, 8]), state.view(np.uint8), keys, prios, t_out)
    assert not state["times_sampled"].any() and not keys.any()
    with pytest.raises(TypeError):  # the records' bytes, not the records
        kernel.mark_sampled(np.array([2, 3]), state, keys, prios, t_out)
    with pytest.raises(TypeError):  # not a whole number of records
        kernel.mark_sampled(np.array([2, 3]), state.view(np.uint8)[:-4], keys, prios, t_out)


@pytest.mark.parametrize("threads", [1, 2])
def test_large_gathers_equal_numpy_on_one_or_two_threads(threads):
    rng = np.random.default_rng(threads)
    frames = rng.integers(0, 256, (3000, 64, 64), dtype=np.uint8)  # 4 KiB rows
    scalars = np.arange(3000, dtype=np.float32)
    frame_rows = rng.integers(0, 3000, 1500)  # 6 MB: split over the threads
    scalar_rows = rng.integers(0, 3000, 777)  # columns of other lengths split too
    outs = (np.zeros((1500, 64, 64), np.uint8), np.zeros(777, np.float32))
    kernel.gather((frames, scalars), (frame_rows, scalar_rows), outs, threads)
    np.testing.assert_array_equal(outs[0], frames[frame_rows])
    np.testing.assert_array_equal(outs[1], scalars[scalar_rows])
