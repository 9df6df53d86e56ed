"""Rows of a nested signature are taken nested, keyed by paths (as a sample's ``data``
gives them) or mixed: what a table samples goes back into one of the same signature."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import InvalidArgumentError, Table, TrajectoryWriter

SIG = {"obs": {"pos": ((2,), "float32"), "vel": "float32"}, "action": "int64"}


def _table() -> Table:
    table = Table("t", signature=SIG, max_size=16, seed=0)
    table.insert({"obs": {"pos": np.ones((4, 2)), "vel": np.arange(4.0)}, "action": np.arange(4)})
    return table


def _one(batch, i: int) -> dict:
    return {p: a[i] for p, a in batch.data.items()}


# name -> rows made from a sample of the table
FORMS = {
    "a_samples_data_as_it_is": lambda b: b.data,
    "a_samples_tree": lambda b: b.tree(),
    "one_row_keyed_by_paths": lambda b: _one(b, 0),
    "one_row_nested": lambda b: {"obs": {"pos": b.data["obs/pos"][0], "vel": 1.0}, "action": 2},
    "paths_in_another_order": lambda b: {
        "action": b.data["action"],
        "obs/vel": b.data["obs/vel"],
        "obs/pos": b.data["obs/pos"],
    },
    "mixed": lambda b: {
        "obs": {"pos": b.data["obs/pos"]},
        "obs/vel": b.data["obs/vel"],
        "action": b.data["action"],
    },
}


@pytest.mark.parametrize("form", FORMS)
def test_rows_are_taken_nested_by_paths_or_mixed(form):
    table = _table()
    batch = table.sample(2)
    rows = FORMS[form](batch)
    keys = table.insert(rows)
    added = table.size - 4
    assert len(keys) == added >= 1
    want = batch.data["obs/pos"][:added]  # every form carries the sample's positions
    np.testing.assert_array_equal(table.store.columns["obs/pos"][4 : 4 + added], want)


def test_a_writer_takes_a_step_keyed_by_paths():
    table = _table()
    with TrajectoryWriter(table) as writer:
        writer.append({"obs/pos": np.zeros(2), "obs/vel": 0.5, "action": 1})
    assert table.store.columns["obs/vel"][4] == 0.5


@pytest.mark.parametrize(
    "rows, words",
    [
        pytest.param(
            {"obs": {"pos": np.ones(2)}, "obs/pos": np.ones(2), "obs/vel": 1.0, "action": 1},
            ["'obs/pos'", "twice"],
            id="a_field_nested_and_by_its_path",
        ),
        pytest.param(
            {"obs//pos": np.ones(2), "obs/vel": 1.0, "action": 1},
            ["'obs//pos'", "non-empty"],
            id="a_path_with_an_empty_part",
        ),
    ],
)
def test_a_field_named_twice_or_by_a_broken_path_is_refused(rows, words):
    table = _table()
    with pytest.raises(InvalidArgumentError) as caught:
        table.insert(rows)
    for word in words:
        assert word in str(caught.value)
    assert table.size == 4


def _path_keyed_spaces(spaces) -> dict:
    box, two = spaces.Box(0, 1, (2,)), spaces.Discrete(2)
    # name -> (space, the value of its first field in an observation)
    return {
        "dict_key_holding_a_path": (spaces.Dict({"a/b": box, "c": box}), lambda o: o["a/b"]),
        "path_key_over_a_tuple": (
            spaces.Dict({"x/y": spaces.Tuple((box, two))}), lambda o: o["x/y"][0]
        ),
        "tuple_over_a_path_key": (
            spaces.Tuple((box, spaces.Dict({"k/l": two}))), lambda o: o[0]
        ),
    }


@pytest.mark.parametrize(
    "case", ["dict_key_holding_a_path", "path_key_over_a_tuple", "tuple_over_a_path_key"]
)
def test_one_row_whose_nested_keys_are_paths_is_one_row(case):
    """A gymnasium Dict key holding the separator names a path inside the nest: one row of
    that space is one row, as it is given nested."""
    gym = pytest.importorskip("gymnasium")
    from rlreplay import Signature

    space, first_value = _path_keyed_spaces(gym.spaces)[case]
    space.seed(0)
    table = Table("t", signature=Signature.from_spaces(space, gym.spaces.Discrete(2)), max_size=4)
    obs = space.sample()
    table.insert({"obs": obs, "action": 1, "reward": 0.0})
    table.insert({"obs": obs, "action": 0, "reward": 1.0})
    assert table.size == 2
    first = table.store.columns[table.store.signature.paths[0]]
    np.testing.assert_array_equal(first[:2], [first_value(obs)] * 2)
