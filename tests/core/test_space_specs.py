"""Gymnasium spaces and shape-and-dtype objects as signature specs.

A space given where a spec goes is read whole (``Box`` by its shape and dtype, ``Discrete``
as an int64 scalar, ``MultiDiscrete`` and ``MultiBinary`` by their shapes, ``Dict`` and
``Tuple`` as nests), never by its ``dtype`` alone, which dropped the shape: a CartPole
``Box(4,)`` became a scalar column and one inserted transition four rows. Every object that
is neither a dtype, a ``(shape, dtype)`` spec, a shape-and-dtype object nor a space of a
fixed shape is refused, naming it.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import rlreplay as rr
from rlreplay import FieldSpec, InvalidArgumentError, Signature

gym = pytest.importorskip("gymnasium")
spaces = gym.spaces

# name -> (space, the fields it makes under "x")
SPACES = {
    "box": (spaces.Box(-1, 1, (4,)), {"x": FieldSpec((4,), "float32")}),
    "box_of_float64_images": (
        spaces.Box(0, 1, (2, 3, 3), np.float64),
        {"x": FieldSpec((2, 3, 3), "float64")},
    ),
    "box_of_uint8": (spaces.Box(0, 255, (84, 84), np.uint8), {"x": FieldSpec((84, 84), "uint8")}),
    "discrete": (spaces.Discrete(3), {"x": FieldSpec((), "int64")}),
    "discrete_with_start": (spaces.Discrete(3, start=-1), {"x": FieldSpec((), "int64")}),
    "multi_discrete": (spaces.MultiDiscrete([3, 4]), {"x": FieldSpec((2,), "int64")}),
    "multi_discrete_2d": (
        spaces.MultiDiscrete([[3, 4], [5, 6]]),
        {"x": FieldSpec((2, 2), "int64")},
    ),
    "multi_binary": (spaces.MultiBinary(5), {"x": FieldSpec((5,), "int8")}),
    "dict": (
        spaces.Dict({"pos": spaces.Box(0, 1, (2,)), "id": spaces.Discrete(4)}),
        {"x/id": FieldSpec((), "int64"), "x/pos": FieldSpec((2,), "float32")},
    ),
    "tuple": (
        spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (3,)))),
        {"x/0": FieldSpec((), "int64"), "x/1": FieldSpec((3,), "float32")},
    ),
    "dict_of_tuple_of_dict": (
        spaces.Dict(
            {"t": spaces.Tuple((spaces.Dict({"m": spaces.MultiBinary(2)}), spaces.Discrete(2)))}
        ),
        {"x/t/0/m": FieldSpec((2,), "int8"), "x/t/1": FieldSpec((), "int64")},
    ),
}


@pytest.mark.parametrize("case", SPACES)
def test_a_space_is_read_whole_as_a_spec(case):
    space, fields = SPACES[case]
    assert Signature({"x": space}).fields == fields


class ShapeDtypeStruct:
    """What ``jax.ShapeDtypeStruct`` is to a signature: a shape and a dtype."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)


# name -> (spec, the field it makes)
SHAPED = {
    "array": (np.zeros((2, 5), np.uint8), FieldSpec((2, 5), "uint8")),
    "shape_dtype_struct": (ShapeDtypeStruct((7,), "float16"), FieldSpec((7,), "float16")),
    "scalar_shape_dtype_struct": (ShapeDtypeStruct((), "int32"), FieldSpec((), "int32")),
}


@pytest.mark.parametrize("case", SHAPED)
def test_an_object_with_a_shape_and_a_dtype_is_a_spec(case):
    spec, field = SHAPED[case]
    assert Signature({"x": spec})["x"] == field


class DtypeOnly:
    dtype = np.dtype("float32")  # numpy's np.dtype() would take it as float32


# name -> (spec, words the message must hold)
REFUSED = {
    "text_space": (spaces.Text(5), ["'x'", "Text", "(shape, dtype)"]),
    "sequence_space": (spaces.Sequence(spaces.Discrete(2)), ["'x'", "Sequence"]),
    "graph_space": (spaces.Graph(spaces.Box(0, 1, (2,)), None), ["'x'", "Graph"]),
    "one_of_space": (spaces.OneOf((spaces.Discrete(2),)), ["'x'", "OneOf"]),
    "an_object_with_only_a_dtype": (DtypeOnly(), ["'x'", "DtypeOnly", "not a numpy dtype"]),
    "a_shape_that_is_not_a_tuple": (
        ShapeDtypeStruct(None, "float32"),
        ["'x'", "ShapeDtypeStruct", "not a numpy dtype"],
    ),
    "a_plain_object": (object(), ["'x'", "object", "not a numpy dtype"]),
    "a_space_inside_a_dtype": (((4,), spaces.Box(0, 1, (4,))), ["'x'", "Box", "not a numpy dtype"]),
    "a_space_class": (spaces.Box, ["'x'", "space class Box", "give a space"]),
    "a_dict_space_class": (spaces.Dict, ["'x'", "space class Dict", "give a space"]),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_is_no_spec_is_refused_naming_it(case):
    spec, words = REFUSED[case]
    with pytest.raises(InvalidArgumentError) as caught:
        Signature({"x": spec})
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_a_cartpole_table_built_from_its_spaces_stores_one_row_per_transition():
    env = gym.make("CartPole-v1")
    space = env.observation_space
    table = rr.Table("r", signature={"obs": space, "next_obs": space}, max_size=100)
    assert table.signature["obs"] == FieldSpec((4,), "float32")
    obs, _ = env.reset(seed=0)
    next_obs = env.step(0)[0]
    keys = table.insert({"obs": obs, "next_obs": next_obs})
    assert len(keys) == 1 and table.size == 1
    np.testing.assert_array_equal(table.sample(1).data["obs"][0], obs)


def test_from_spaces_gives_a_steps_fields_from_an_environments_spaces():
    env = gym.make("CartPole-v1")
    sig = Signature.from_spaces(env.observation_space, env.action_space)
    assert sig.fields == {
        "obs": FieldSpec((4,), "float32"),
        "action": FieldSpec((), "int64"),
        "reward": FieldSpec((), "float32"),
    }
    rows = Signature.from_spaces(
        env.observation_space,
        env.action_space,
        extras={"next_obs": env.observation_space, "terminated": "bool"},
    )
    assert rows.paths == ("obs", "action", "reward", "next_obs", "terminated")
    assert rows["next_obs"] == FieldSpec((4,), "float32")


def test_from_spaces_nests_a_dict_observation_space():
    obs = spaces.Dict({"pos": spaces.Box(0, 1, (2,)), "goal": spaces.Discrete(3)})
    sig = Signature.from_spaces(obs, spaces.Box(-1, 1, (2,)), reward="float64")
    assert sig.paths == ("obs/goal", "obs/pos", "action", "reward")
    assert sig["reward"] == FieldSpec((), "float64")


# name -> a signature helper called with extras
WITH_EXTRAS = {
    "from_spaces": lambda extras: Signature.from_spaces(
        spaces.Box(0, 1, (2,)), spaces.Discrete(2), extras=extras
    ),
    "nstep": lambda extras: rr.NStepTransitionAdder.signature(
        obs=((2,), "float32"), action="int64", extras=extras
    ),
    "sequence": lambda extras: rr.SequenceAdder.signature(
        obs=((2,), "float32"), action="int64", extras=extras
    ),
    "rollout": lambda extras: rr.RolloutAdder.signature(
        obs=((2,), "float32"), action="int64", num_envs=3, extras=extras
    ),
}


@pytest.mark.parametrize("helper", WITH_EXTRAS)
@pytest.mark.parametrize("field", ["obs", "action", "reward"])
def test_signature_helpers_refuse_extras_that_would_replace_their_own_fields(helper, field):
    with pytest.raises(InvalidArgumentError, match=f"extras name \\['{field}'\\]"):
        WITH_EXTRAS[helper]({field: "float64"})


@pytest.mark.parametrize("helper", WITH_EXTRAS)
@pytest.mark.parametrize("extras", [["logp"], "logp", ("logp", "float32")])
def test_signature_helpers_refuse_extras_that_are_not_a_dict(helper, extras):
    with pytest.raises(InvalidArgumentError, match=r"extras=.* must be a dict of field name"):
        WITH_EXTRAS[helper](extras)


@pytest.mark.parametrize("helper", WITH_EXTRAS)
def test_signature_helpers_add_extras_beside_their_own_fields(helper):
    sig = WITH_EXTRAS[helper]({"logp": "float32"})
    assert "logp" in sig.paths and "obs" in sig.paths


ADDERS = {
    "nstep": lambda obs, act: rr.NStepTransitionAdder.signature(obs=obs, action=act),
    "sequence": lambda obs, act: rr.SequenceAdder.signature(obs=obs, action=act),
    "rollout": lambda obs, act: rr.RolloutAdder.signature(obs=obs, action=act, num_envs=3),
}


@pytest.mark.parametrize("adder", ADDERS)
def test_the_adders_signature_helpers_take_spaces(adder):
    obs = spaces.Dict({"image": spaces.Box(0, 255, (8, 8), np.uint8), "v": spaces.Box(0, 1, (2,))})
    sig = ADDERS[adder](obs, spaces.MultiDiscrete([3, 4]))
    lead = (3,) if adder == "rollout" else ()
    assert sig["obs/image"] == FieldSpec((*lead, 8, 8), "uint8")
    assert sig["obs/v"] == FieldSpec((*lead, 2), "float32")
    assert sig["action"] == FieldSpec((*lead, 2), "int64")


def test_reading_spaces_does_not_import_gymnasium():
    code = (
        "import sys, rlreplay, rlreplay.core.specs\n"
        "assert 'gymnasium' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


TUPLE_SPACE = spaces.Tuple(
    (spaces.Discrete(3), spaces.Box(0, 1, (2,)), spaces.Dict({"m": spaces.MultiBinary(2)}))
)
ONE = (np.int64(2), np.array([0.25, 0.5], np.float32), {"m": np.array([1, 0], np.int8)})
BATCH = (
    np.array([0, 1]),
    np.zeros((2, 2), np.float32),
    {"m": np.ones((2, 2), np.int8)},
)

# (name, value of the Tuple field as gymnasium or a user gives it, rows it stores)
TUPLE_VALUES = [
    ("one row as a tuple", ONE, 1),
    ("a batch as a tuple (a vector env's)", BATCH, 2),
]


@pytest.mark.parametrize("value,n", [c[1:] for c in TUPLE_VALUES], ids=[c[0] for c in TUPLE_VALUES])
def test_a_tuple_spaces_value_is_stored_as_gymnasium_gives_it(value, n):
    # seeded: 8 uniform draws of 2 items are all one item once in 128 unseeded runs
    table = rr.Table("t", signature={"obs": TUPLE_SPACE, "r": "float32"}, max_size=8, seed=0)
    keys = table.insert({"obs": value, "r": np.zeros(n) if n > 1 else 0.0})
    assert len(keys) == n
    data = table.sample(8).data
    assert set(data["obs/0"].tolist()) == ({2} if n == 1 else {0, 1})
    assert set(data["obs/2/m"][:, 0].tolist()) == {1}
    assert data["obs/1"].shape == (8, 2)


def test_a_tuple_of_the_wrong_length_is_refused_naming_the_missing_field():
    table = rr.Table("t", signature={"obs": TUPLE_SPACE}, max_size=8)
    with pytest.raises(rr.SignatureError, match="obs/2/m"):
        table.insert({"obs": ONE[:2]})
    assert table.size == 0


def test_an_adder_takes_tuple_observations_from_one_env_and_from_a_vector_env():
    sig = rr.NStepTransitionAdder.signature(obs=TUPLE_SPACE, action="int64")
    table = rr.Table("n", signature=sig, layout=rr.NStepTransitionAdder.layout(sig, n=2),
                     max_size=64)  # fmt: skip
    one = rr.NStepTransitionAdder(table, n=2, discount=0.9)
    one.reset(ONE)
    for i in range(3):
        one.add(0, 1.0, ONE, i == 2, False)
    one.flush()
    assert table.size == 3
    vec = rr.NStepTransitionAdder(table, n=2, discount=0.9, num_envs=2)
    vec.reset(BATCH)
    for i in range(3):
        vec.add(np.zeros(2, np.int64), np.ones(2), BATCH, np.array([False, i == 2]),
                np.zeros(2, bool))  # fmt: skip
    vec.flush()
    # env 1's three items; env 0's episode is open: an item reads the row of the step n
    # after it, appended once that row's own return is known
    assert table.size == 3 + 3
    assert table.sample(4).data["next_obs/2/m"].shape == (4, 2)


def test_a_list_of_per_row_tuples_is_refused_not_read_transposed():
    pair = spaces.Tuple((spaces.Discrete(10), spaces.Discrete(10)))
    table = rr.Table("t", signature={"obs": pair}, max_size=8)
    with pytest.raises(rr.SignatureError, match="obs/0"):
        table.insert({"obs": [(1, 2), (3, 4)]})
    assert table.size == 0
