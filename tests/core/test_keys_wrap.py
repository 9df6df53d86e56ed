"""Keys stay valid and stale keys stay stale when a slot's generation goes round.

A key is ``generation << 32 | slot`` with generations cycling through 1 .. 2**31 - 1 (see
rlreplay/core/keys.py). These tests set a slot's generation next to the end of that cycle
directly in the table's records (which count a slot's items; a key's generation is that
count moved by the table's generation origin), then insert, sample, update and delete with
the keys the table hands out, through the compiled loops and through the numpy path.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay import Prioritized, Table
from rlreplay.core import item_draws, item_index
from rlreplay.core.keys import (
    CYCLED,
    GENERATIONS,
    make_keys,
    next_generation,
    next_generations,
    relative_generations,
    unissued,
)
from rlreplay.core.table import SLOT_STATE
from rlreplay.errors import InvalidArgumentError

SIZE = 4
COMPILED = item_index._kernel is not None and item_draws._kernel is not None


@pytest.fixture(params=["compiled", "numpy"])
def path(request, monkeypatch) -> str:
    """Run the test through the compiled per-slot loops or through the numpy path."""
    if request.param == "compiled":
        if not COMPILED:
            pytest.skip("the compiled kernels are not built or RLREPLAY_NO_EXTENSION is set")
    else:
        monkeypatch.setattr(item_index, "_kernel", None)
        monkeypatch.setattr(item_draws, "_kernel", None)
    return request.param


def near_the_end(field: int) -> Table:
    """A prioritized table whose every slot has the generation field ``field``."""
    table = Table("t", signature={"x": "int64"}, max_size=SIZE, sampler=Prioritized(1.0), seed=3)
    assert table.index.origin > 0  # the keys below are moved by it
    table.index.generation[:] = field
    return table


def counts(table: Table, keys: np.ndarray) -> list[int]:
    """The item counts (generation fields) that ``keys`` stand for in ``table``."""
    return relative_generations(np.asarray(keys) >> 32, table.index.origin).tolist()


def key(table: Table, slot: int, count: int) -> np.ndarray:
    """The key of ``slot``'s ``count``-th item in ``table`` (0: generation 0, never issued)."""
    if count == 0:
        return np.array([slot], np.int64)
    return make_keys(np.array([slot]), np.array([count]), table.index.origin)


def insert(table: Table, one_row: bool, first: int) -> np.ndarray:
    """Fill the table with SIZE new items, one row at a time or as one batch."""
    if one_row:
        return np.concatenate([table.insert({"x": np.int64(first + i)}) for i in range(SIZE)])
    return table.insert({"x": np.arange(first, first + SIZE)})


# A slot's generation field before the test -> the generations of three rounds of items.
STARTS = {
    "last-before-first-cycle": (GENERATIONS - 1, [GENERATIONS, 1, 2]),
    "last-before-a-later-cycle": (CYCLED | (GENERATIONS - 1), [GENERATIONS, 1, 2]),
    "last-of-a-cycle-at-the-old-uint32-limit": (CYCLED | GENERATIONS, [1, 2, 3]),
}


@pytest.mark.parametrize("one_row", [True, False], ids=["one-row", "batch"])
@pytest.mark.parametrize("start, expected", STARTS.values(), ids=STARTS.keys())
def test_keys_across_the_generation_cycle_stay_valid_and_stale_keys_stay_stale(
    path, one_row, start, expected
):
    table = near_the_end(start)
    generations = []
    issued = []
    for round_ in range(3):  # each round replaces every item: the generations go round
        keys = insert(table, one_row, 100 * round_)
        assert keys.dtype == np.int64 and (keys >= 0).all()
        np.testing.assert_array_equal(keys & 0xFFFFFFFF, np.arange(SIZE))
        generations.append(counts(table, keys[:1])[0])
        issued.append(keys)
        sample = table.sample(SIZE)
        assert set(sample.info.keys.tolist()) <= set(keys.tolist())
        assert table.update_priorities(keys, np.arange(1.0, SIZE + 1)) == SIZE
        np.testing.assert_array_equal(table.index.priority, np.arange(1.0, SIZE + 1))
        for old in issued[:-1]:  # earlier rounds' keys: skipped and counted, never applied
            assert table.update_priorities(old, 9.0) == 0
            assert table.delete(old) == 0
        assert len(table) == SIZE
    assert (table.index.priority < 9.0).all()
    assert generations == expected
    assert table.info().stale_updates == table.info().stale_deletes == SIZE * 3
    assert table.delete(issued[-1]) == SIZE and len(table) == 0


def test_a_key_newer_than_its_slot_is_refused_until_the_slot_has_cycled(path):
    fresh = near_the_end(5)
    fresh.insert({"x": np.arange(SIZE)})  # generation 6
    with pytest.raises(InvalidArgumentError, match="never issued"):
        fresh.update_priorities(key(fresh, 1, 7), 1.0)
    with pytest.raises(InvalidArgumentError, match="never issued"):
        fresh.delete(key(fresh, 1, 0))
    assert fresh.update_priorities(key(fresh, 1, 5), 1.0) == 0  # issued before: stale
    cycled = near_the_end(CYCLED | 5)
    cycled.insert({"x": np.arange(SIZE)})  # generation 6 again, after a whole cycle
    stale = np.r_[key(cycled, 1, 7), key(cycled, 2, GENERATIONS)]
    assert cycled.update_priorities(stale, 1.0) == 0
    assert cycled.info().stale_updates == 2
    with pytest.raises(InvalidArgumentError, match="never issued"):  # generation 0: never
        cycled.delete(key(cycled, 1, 0))


def test_relocated_items_get_the_next_generation_across_the_cycle(path):
    table = Table.stack("s", 2, signature={"x": "int64"}, seed=5)  # relocates, capacity 4
    table.index.generation[:] = GENERATIONS
    bottom = table.insert({"x": np.arange(2)})[0]
    sampled = []
    for i in range(2, 14):  # the bottom item is moved ahead of the ring as it turns
        sampled.append(table.sample(1).info.keys)
        table.insert({"x": np.int64(i)})
    assert table.info().relocations > 0
    assert table.update_priorities(bottom, 1.0) == 0  # its old key: stale, not refused
    assert table.info().stale_updates == 1
    sampled += [table.sample(1).info.keys for _ in range(2)]
    keys = np.concatenate(sampled)
    assert (keys >= 0).all() and ((keys >> 32) >= 1).all()
    assert all(1 <= c <= 14 for c in counts(table, keys))  # went round: 1, 2, ... again
    moved = keys[-1]  # the bottom item, last out, under a key of its new slot
    assert moved != bottom and moved >> 32 >= 1


FIELDS = st.one_of(
    st.sampled_from([0, 1, GENERATIONS - 1, GENERATIONS, CYCLED, CYCLED | 1]),
    st.sampled_from([CYCLED | (GENERATIONS - 1), CYCLED | GENERATIONS]),
    st.integers(0, 2**32 - 1),
)
ORIGINS = st.one_of(st.sampled_from([0, 1, GENERATIONS - 1]), st.integers(0, GENERATIONS - 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(FIELDS, min_size=1, max_size=16), ORIGINS)
def test_the_next_generation_agrees_in_numpy_python_and_c(fields, origin):
    arr = np.array(fields, dtype=np.uint32)
    nxt = next_generations(arr)
    assert nxt.dtype == np.uint32
    assert nxt.tolist() == [next_generation(f) for f in fields]
    gens = nxt & GENERATIONS
    assert ((gens >= 1) & (gens <= GENERATIONS)).all()
    cycled = (arr & CYCLED).astype(bool) | ((arr & GENERATIONS) == GENERATIONS)
    np.testing.assert_array_equal((nxt & CYCLED).astype(bool), cycled)
    np.testing.assert_array_equal(
        gens, np.where((arr & GENERATIONS) == GENERATIONS, 1, (arr & GENERATIONS) + 1)
    )
    if item_index._kernel is not None:
        state = np.zeros(len(fields), dtype=SLOT_STATE)
        state["generation"] = arr
        keys = np.empty(len(fields), np.int64)
        live = np.zeros(len(fields), bool)
        item_index._kernel.claim_range(0, keys, state.view(np.uint8), live, None, 1.0, origin)
        np.testing.assert_array_equal(state["generation"], nxt)
        np.testing.assert_array_equal(keys, make_keys(np.arange(len(fields)), nxt, origin))
        assert (keys >= 0).all() and live.all()
    keys = make_keys(np.arange(len(fields)), nxt, origin)
    assert ((keys >> 32 >= 1) & (keys >> 32 <= GENERATIONS)).all()
    np.testing.assert_array_equal(relative_generations(keys >> 32, origin), gens)


@settings(max_examples=300, deadline=None)
@given(FIELDS, st.integers(0, GENERATIONS), ORIGINS)
def test_unissued_keys_agree_in_numpy_and_c(field, generation, origin):
    """A key (generation ``generation``) of a live slot is refused (C: None) exactly when
    numpy calls it unissued for the table's origin, and otherwise it is held exactly when
    it stands for the slot's current item count."""
    count = int(relative_generations(np.array([generation]), origin)[0])
    assert count == (0 if generation == 0 else (generation - origin - 1) % GENERATIONS + 1)
    never = bool(unissued(np.array([count]), np.array([field], np.uint32))[0])
    assert never == (count == 0 or (not field & CYCLED and count > field))
    if item_index._kernel is None:
        return
    state = np.zeros(1, dtype=SLOT_STATE)
    state["generation"] = field
    out = np.empty(1, np.int64)
    got = item_index._kernel.held_slots(
        np.array([generation << 32], np.int64),
        state.view(np.uint8),
        np.ones(1, bool),
        None,
        out,
        None,
        origin,
    )
    if never:
        assert got is None
    else:
        held = count == field & GENERATIONS
        assert got == ((1, 0) if held else (0, 1))
