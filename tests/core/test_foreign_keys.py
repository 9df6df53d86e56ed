"""Keys of one table are refused by another: no table changes an item for a key it never
issued, however alike the two tables are.

Every table draws a generation origin when it is built (derived from ``seed`` and the name
when seeded), and its keys carry their slots' item counts moved by it (see
rlreplay/core/keys.py). Keys of another table then fall outside the generations this
table issued for their slots and are refused with InvalidArgumentError, the whole call
changing nothing, through the compiled loops and the numpy path, locally and through the
server.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import rlreplay
from rlreplay import Prioritized, StepStore, Table
from rlreplay.core import item_draws, item_index
from rlreplay.core.keys import GENERATIONS, generation_origin
from rlreplay.errors import InvalidArgumentError

SIG = {"obs": ((3,), "float32"), "reward": "float32"}
N = 16


def rows(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {
        "obs": np.arange(start, start + 3 * n, dtype=np.float32).reshape(n, 3),
        "reward": np.arange(start, start + n, dtype=np.float32),
    }


@pytest.fixture(params=["compiled", "numpy"])
def path(request, monkeypatch) -> str:
    """Run the test through the compiled per-slot loops or through the numpy path."""
    if request.param == "compiled":
        if item_index._kernel is None or item_draws._kernel is None:
            pytest.skip("the compiled kernels are not built or RLREPLAY_NO_EXTENSION is set")
    else:
        monkeypatch.setattr(item_index, "_kernel", None)
        monkeypatch.setattr(item_draws, "_kernel", None)
    return request.param


def prioritized(name: str, **kwargs) -> Table:
    kwargs.setdefault("signature", SIG)
    return Table(name, max_size=N, sampler=Prioritized(1.0), **kwargs)


# How the two tables are made: both with the same signature, with seeds and without, and
# two tables over one shared store. Each returns (a, b).
def seeded_pair() -> tuple[Table, Table]:
    return prioritized("a", seed=1), prioritized("b", seed=2)


def unseeded_pair() -> tuple[Table, Table]:
    return prioritized("a"), prioritized("b")


def same_seed_pair() -> tuple[Table, Table]:
    return prioritized("a", seed=7), prioritized("b", seed=7)


def shared_store_pair() -> tuple[Table, Table]:
    store = StepStore(SIG, 2 * N)
    a = Table("a", store=store, max_size=2 * N, sampler=Prioritized(1.0), seed=3)
    b = Table("b", store=store, max_size=2 * N, sampler=Prioritized(1.0), seed=3)
    return a, b


PAIRS: dict[str, Callable[[], tuple[Table, Table]]] = {
    "seeded": seeded_pair,
    "unseeded": unseeded_pair,
    "same-seed-other-name": same_seed_pair,
    "shared-store": shared_store_pair,
}


def fill(a: Table, b: Table) -> tuple[np.ndarray, np.ndarray]:
    """Insert the same rows into both tables; over a shared store, both tables make items
    on the same stored steps (the same slots). Returns both tables' keys."""
    if a.store is b.store:
        ka = a.insert(rows(N))
        return ka, b.create_items(np.arange(a.store.next_id - N, a.store.next_id))
    return a.insert(rows(N)), b.insert(rows(N))


def state(table: Table) -> tuple:
    return (
        table.info().to_dict(),
        table.index.priority.copy(),
        table.index.live.copy(),
        table.index.times_sampled.copy(),
        np.copy(table.sampler.sums.leaves),
    )


def assert_unchanged(before: tuple, after: tuple) -> None:
    assert before[0] == after[0]
    for x, y in zip(before[1:], after[1:]):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("make", PAIRS.values(), ids=PAIRS.keys())
def test_keys_of_another_table_are_refused_and_change_nothing(path, make):
    a, b = make()
    ka, kb = fill(a, b)
    sampled = a.sample(8).info.keys  # keys made by the draw loop, too
    before = state(b)
    for keys in (ka[:3], sampled, np.r_[kb[:2], ka[5]]):  # a mixed batch fails as a whole
        with pytest.raises(InvalidArgumentError, match="not keys of this table"):
            b.update_priorities(keys, np.full(len(keys), 1000.0))
        with pytest.raises(InvalidArgumentError, match="not keys of this table"):
            b.delete(keys)
        with pytest.raises(InvalidArgumentError, match="not keys of this table"):
            b.update_priorities(keys.tolist(), [1000.0] * len(keys))  # the Python path
    assert_unchanged(before, state(b))
    assert b.info().stale_updates == b.info().stale_deletes == 0
    # each table still takes its own keys
    assert b.update_priorities(kb[:3], 5.0) == 3 and a.update_priorities(ka[:3], 5.0) == 3
    assert b.delete(kb[:2]) == 2 and a.delete(ka[:2]) == 2


def test_tables_issue_different_keys_and_seeded_tables_the_same_ones_every_time():
    a, b = seeded_pair()
    ka, kb = fill(a, b)
    assert not set(ka.tolist()) & set(kb.tolist())
    again = prioritized("a", seed=1).insert(rows(N))
    np.testing.assert_array_equal(again, ka)  # a seeded run is reproducible
    np.testing.assert_array_equal(ka & 0xFFFFFFFF, np.arange(N))
    assert ((ka >= 0) & (ka >> 32 >= 1) & (ka >> 32 <= GENERATIONS)).all()
    origins = {generation_origin(None, "t") for _ in range(8)}
    assert len(origins) == 8 and all(0 <= o < GENERATIONS for o in origins)
    assert generation_origin(7, "a") != generation_origin(7, "b")
    assert generation_origin(7, "a") == generation_origin(7, "a")


def test_stale_keys_of_this_table_are_still_skipped_and_counted(path):
    table = prioritized("t", seed=4)
    old = table.insert(rows(N))
    new = table.insert(rows(N, 50))  # replaces every item: the old keys are stale
    assert table.update_priorities(old, 9.0) == 0 and table.delete(old[:4]) == 0
    assert table.info().stale_updates == N and table.info().stale_deletes == 4
    assert table.update_priorities(new, 2.0) == N


def test_the_server_refuses_keys_of_another_table():
    a, b = seeded_pair()
    with rlreplay.Server([a, b], bind="127.0.0.1") as server:
        client = rlreplay.Client(server.address, call_timeout=10)
        try:
            ka = client.insert("a", rows(N))
            kb = client.insert("b", rows(N))
            before = state(b)
            with pytest.raises(InvalidArgumentError, match="not keys of this table"):
                client.update_priorities("b", ka[:3], [1000.0] * 3)
            assert_unchanged(before, state(b))
            assert client.update_priorities("b", kb[:3], [2.0] * 3) == 3
        finally:
            client.close()
