"""A store or table that cannot fit in memory is refused at construction, naming the bytes
needed and available; ``capacity_bytes=`` sizes one by a byte budget."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import rlreplay
from rlreplay.core import memory
from rlreplay.errors import InsufficientMemoryError, InvalidArgumentError
from rlreplay.net.server.config import tables_from_config

BIG_ROW = {"frame": ((1024, 1024), "uint8")}  # 1 MiB per step
# 2**31 - 1 steps of 1 MiB: 2 PiB, more than any machine this runs on.
TOO_MANY = 2**31 - 1
FRAME = {"frame": {"shape": [1024, 1024], "dtype": "uint8"}}
TOO_MANY_CONFIG = {
    "store": [{"name": "s", "capacity": TOO_MANY, "signature": FRAME}],
    "table": [{"name": "t", "store": "s"}],
}


def available_or_skip() -> int:
    avail = memory.available_bytes()
    if avail is None:
        pytest.skip("this system does not say how much memory is available")
    return avail


REFUSED = {
    "store_by_capacity": lambda: rlreplay.StepStore(BIG_ROW, TOO_MANY),
    "table_with_its_own_store": lambda: rlreplay.Table("t", signature=BIG_ROW, max_size=TOO_MANY),
    "queue_with_its_own_store": lambda: rlreplay.Table.queue("q", 2**29, signature=BIG_ROW),
    "store_from_config": lambda: tables_from_config(TOO_MANY_CONFIG),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_configuration_larger_than_memory_is_refused_with_bytes_needed_and_available(case):
    avail = available_or_skip()
    start = time.monotonic()
    with pytest.raises(InsufficientMemoryError) as err:
        REFUSED[case]()
    exc = err.value
    assert isinstance(exc, InvalidArgumentError)  # a configuration error, exit status 2
    assert exc.needed_bytes > exc.available_bytes
    assert exc.available_bytes <= avail * 1.5 + (1 << 30)  # what the machine has, roughly
    assert str(exc.needed_bytes) in str(exc) and str(exc.available_bytes) in str(exc)
    assert "capacity" in str(exc)  # says what to change
    assert time.monotonic() - start < 5.0  # refused before anything was written


@pytest.mark.parametrize(
    "build",
    [
        lambda: rlreplay.StepStore(BIG_ROW, capacity_bytes=1 << 60),
        lambda: rlreplay.Table("t", signature=BIG_ROW, capacity_bytes=1 << 60),
    ],
    ids=["store", "table"],
)
def test_a_capacity_bytes_larger_than_memory_is_refused_naming_capacity_bytes(build):
    available_or_skip()
    with pytest.raises(InsufficientMemoryError) as err:
        build()
    assert f"lower capacity_bytes={1 << 60}" in str(err.value)
    assert "give capacity_bytes=" not in str(err.value)  # the user did give it


def test_item_index_larger_than_memory_is_refused_when_its_store_fits():
    avail = available_or_skip()
    capacity = 2**31 - 1  # 2 GiB of one-byte steps; the index needs ~40 bytes per slot
    if avail < 3 * capacity:
        pytest.skip("needs a few GiB available for the store")
    store = rlreplay.StepStore({"x": "uint8"}, capacity)
    if 40 * capacity < avail:
        pytest.skip("this machine could hold the index")
    with pytest.raises(InsufficientMemoryError, match="item index of table 'big'") as err:
        rlreplay.Table("big", store=store, sampler=rlreplay.MinHeap())
    assert err.value.needed_bytes >= 24 * capacity  # the heap's index is counted


def test_stores_promised_earlier_count_against_the_next_one_until_they_are_dropped():
    avail = available_or_skip()
    with open("/proc/sys/vm/overcommit_memory") as f:
        if f.read().strip() == "2":
            pytest.skip("strict overcommit: a large untouched allocation may be refused")
    rows = int(avail * 0.6) // (1 << 20)
    first = rlreplay.StepStore(BIG_ROW, rows)  # fits, untouched (numpy allocates lazily)
    with pytest.raises(InsufficientMemoryError):
        rlreplay.StepStore(BIG_ROW, rows)  # would fit alone, not beside the first
    del first
    gc.collect()
    second = rlreplay.StepStore(BIG_ROW, rows)
    assert second.capacity == rows


def test_small_configurations_are_neither_checked_nor_counted():
    before = memory._promised
    tables = [rlreplay.Table("t", signature={"x": "float32"}, max_size=1000) for _ in range(10)]
    assert memory._promised == before
    assert all(t.store.capacity == 1000 for t in tables)


STORE_BUDGETS = {  # signature, lanes, capacity_bytes -> steps
    "exact_multiple": ({"obs": ((4,), "float32")}, 1, 16 * 100, 100),
    "rounded_down": ({"obs": ((4,), "float32")}, 1, 16 * 100 + 15, 100),
    "multiple_of_lanes": ({"obs": ((4,), "float32")}, 4, 16 * 103, 100),
    "nested_fields": ({"o": {"a": "float64", "b": ((2,), "int32")}}, 1, 16 * 7, 7),
    "numpy_int_budget": ({"x": "uint8"}, 1, np.int64(50), 50),
}


@pytest.mark.parametrize("case", sorted(STORE_BUDGETS))
def test_store_capacity_bytes_resolves_to_the_most_steps_that_fit(case):
    signature, lanes, budget, steps = STORE_BUDGETS[case]
    store = rlreplay.StepStore(signature, lanes=lanes, capacity_bytes=budget)
    assert store.capacity == steps
    assert store.nbytes <= budget < store.nbytes + lanes * store.signature.step_nbytes


SAMPLERS = {
    "Uniform": rlreplay.Uniform,
    "Prioritized": lambda: rlreplay.Prioritized(0.6),
    "MinHeap": rlreplay.MinHeap,
}


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_table_capacity_bytes_counts_its_store_and_item_index(sampler):
    chosen = SAMPLERS[sampler]()
    budget = 4 << 20
    table = rlreplay.Table(
        "t", signature={"obs": ((16,), "float32")}, capacity_bytes=budget, sampler=chosen
    )
    index = table.index
    used = table.store.nbytes + index.slot_state.nbytes + index.live.nbytes
    used += index.sampler.nbytes()
    if getattr(index, "remover_active", True):  # a table that never evicts binds no remover
        used += index.remover.nbytes()
    assert used <= budget
    assert budget - used < budget / 100  # within 1% of it (tree levels round up)
    assert table.max_size == table.store.capacity  # max_size defaults to what fits
    keys = table.insert({"obs": np.ones((3, 16), np.float32)})
    assert len(keys) == 3


BAD_BUDGETS = {
    "zero": (lambda: rlreplay.StepStore({"x": "float32"}, capacity_bytes=0), "capacity_bytes=0"),
    "negative": (lambda: rlreplay.StepStore({"x": "f4"}, capacity_bytes=-8), "capacity_bytes=-8"),
    "float": (lambda: rlreplay.StepStore({"x": "f4"}, capacity_bytes=1.5e9), "positive int"),
    "bool": (lambda: rlreplay.StepStore({"x": "float32"}, capacity_bytes=True), "positive int"),
    "text": (lambda: rlreplay.StepStore({"x": "float32"}, capacity_bytes="1GiB"), "positive int"),
    "less_than_a_step": (
        lambda: rlreplay.StepStore({"x": ((10,), "float32")}, capacity_bytes=39),
        "give at least 40 bytes",
    ),
    "less_than_a_step_per_lane": (
        lambda: rlreplay.StepStore({"x": "float32"}, lanes=4, capacity_bytes=12),
        "lanes=4",
    ),
    "store_with_both": (
        lambda: rlreplay.StepStore({"x": "float32"}, 10, capacity_bytes=400),
        "give one of capacity=",
    ),
    "store_with_neither": (lambda: rlreplay.StepStore({"x": "float32"}), "give one of capacity="),
    "table_with_capacity_too": (
        lambda: rlreplay.Table("t", signature={"x": "f4"}, capacity=10, capacity_bytes=4000),
        "without capacity= or store=",
    ),
    "table_over_a_shared_store": (
        lambda: rlreplay.Table("t", store=rlreplay.StepStore({"x": "f4"}, 10), capacity_bytes=4000),
        "shared store takes its own capacity_bytes",
    ),
    "table_less_than_a_step_and_slot": (
        lambda: rlreplay.Table("t", signature={"x": "float32"}, capacity_bytes=20),
        "holds no row",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BUDGETS))
def test_bad_capacity_bytes_is_refused_naming_the_argument(case):
    make, words = BAD_BUDGETS[case]
    with pytest.raises(InvalidArgumentError) as err:
        make()
    assert not isinstance(err.value, InsufficientMemoryError)
    assert words in str(err.value)


def test_served_configuration_takes_capacity_bytes():
    cfg = {
        "store": [{"name": "s", "capacity_bytes": 4000, "signature": {"x": "float32"}}],
        "table": [
            {"name": "a", "store": "s"},
            {"name": "b", "signature": {"x": "float32"}, "capacity_bytes": 4000},
        ],
    }
    a, b = tables_from_config(cfg)
    assert a.store.capacity == 1000
    assert 0 < b.store.capacity < 1000  # its item index takes part of the budget


def test_queue_takes_capacity_bytes_for_its_own_store():
    queue = rlreplay.Table.queue("q", 10, signature={"x": "float32"}, capacity_bytes=4000)
    assert queue.max_size == 10 and 10 < queue.store.capacity < 1000


@pytest.mark.parametrize("max_size", [None, 500])
def test_item_index_estimate_matches_the_index_the_table_builds(max_size):
    """The estimate probes a real item index, so it follows its layout (record size,
    whether the remover is bound) whatever the selectors."""
    for sampler in (rlreplay.Uniform(), rlreplay.Prioritized(0.6), rlreplay.MinHeap()):
        table = rlreplay.Table(
            "t", signature={"x": "uint8"}, capacity=1 << 16, max_size=max_size, sampler=sampler
        )
        index = table.index
        used = index.slot_state.nbytes + index.live.nbytes + index.sampler.nbytes()
        if getattr(index, "remover_active", True):
            used += index.remover.nbytes()
        evicts = table.max_size < table.store.capacity
        estimate = memory.index_slot_bytes(sampler, rlreplay.Fifo(), False, evicts) * (1 << 16)
        assert abs(estimate - used) <= used / 100, (type(sampler).__name__, estimate, used)

