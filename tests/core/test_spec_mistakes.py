"""Ordinary mistakes in a signature or a layout are refused when the table is built.

A signature numpy would read differently from what the user meant (a ``(dtype, shape)``
tuple becomes a subarray dtype of shape ``()``, ``None`` becomes float64, ``'U'`` a string
of length 0 that cuts every value) is refused by ``Signature``/``FieldSpec`` with an
:class:`InvalidArgumentError` naming the field and saying what to give instead, so no
table is ever built with a column that fails only at the first insert.
"""

from __future__ import annotations

import numpy as np
import pytest

import rlreplay as rr
from rlreplay import FieldSpec, InvalidArgumentError, ItemLayout, Signature, Window

SIG = {"obs": ((4,), "float32"), "action": "int64", "reward": "float32"}

# (signature, words the message must hold)
BAD_SIGNATURES = [
    pytest.param(
        {"obs": ("float32", (4,))},
        ["'obs'", "give (shape, dtype), e.g. ((4,), 'float32')"],
        id="dtype_and_shape_swapped",
    ),
    pytest.param(
        {"obs": (np.float32, 4)},
        ["'obs'", "give (shape, dtype), e.g. ((4,), 'float32')"],
        id="swapped_with_a_numpy_type_and_an_int_shape",
    ),
    pytest.param(
        {"obs": ("uint8", ())},
        ["'obs'", "give (shape, dtype), e.g. ((), 'uint8')"],
        id="swapped_scalar",
    ),
    pytest.param(
        {"obs": "(4,)f4"},
        ["'obs'", "subarray", "((4,), 'float32')"],
        id="subarray_dtype_string",
    ),
    pytest.param(
        {"obs": ((2,), np.dtype(("float32", (4,))))},
        ["'obs'", "subarray", "((2, 4), 'float32')"],
        id="subarray_dtype_object_with_a_shape",
    ),
    pytest.param(
        {"obs": ((4,), ("float32", 2))},
        ["'obs'", "not one dtype", "(shape, dtype)"],
        id="dtype_given_as_a_tuple",
    ),
    pytest.param(
        {"obs": "f4,i4"},
        ["'obs'", "structured", "own signature field"],
        id="structured_dtype_string",
    ),
    pytest.param(
        {"obs": np.dtype([("x", "f4"), ("y", "f4")])},
        ["'obs'", "structured", "['x', 'y']"],
        id="structured_dtype_object",
    ),
    pytest.param({"obs": ((-1,), "float32")}, ["'obs'", "-1", "int >= 0"], id="negative_dim"),
    pytest.param({"obs": ((4.0,), "float32")}, ["'obs'", "4.0", "int >= 0"], id="float_dim"),
    pytest.param({"obs": ((4.5,), "float32")}, ["'obs'", "4.5", "int >= 0"], id="fraction_dim"),
    pytest.param({"obs": ((True,), "float32")}, ["'obs'", "True", "int >= 0"], id="bool_dim"),
    pytest.param(
        {"obs": ("44", "float32")}, ["'obs'", "'44'", "not a tuple of ints"], id="string_shape"
    ),
    pytest.param({"obs": "object"}, ["'obs'", "Python objects"], id="object_dtype"),
    pytest.param({"obs": ((3,), dict)}, ["'obs'", "Python objects"], id="python_type_as_object"),
    pytest.param({"obs": None}, ["'obs'", "None", "float64"], id="dtype_none"),
    pytest.param({"obs": ((4,), None)}, ["'obs'", "None", "float64"], id="dtype_none_in_tuple"),
    pytest.param({"name": "U"}, ["'name'", "no length", "'U16'"], id="string_without_length"),
    pytest.param({"name": bytes}, ["'name'", "no length", "'S16'"], id="bytes_without_length"),
    pytest.param({"t": "M8"}, ["'t'", "no unit", "'datetime64[ms]'"], id="datetime_without_unit"),
    pytest.param({"obs": "floot32"}, ["'obs'", "'floot32'", "not a numpy dtype"], id="typo"),
    pytest.param({"obs": 4}, ["'obs'", "not a numpy dtype"], id="int_as_dtype"),
    pytest.param({"obs": "f4,("}, ["'obs'", "not a numpy dtype"], id="dtype_numpy_cannot_parse"),
    pytest.param(
        {"obs": ((4,), "((4,),f4)")}, ["'obs'", "not a numpy dtype"], id="dtype_string_of_a_tuple"
    ),
    pytest.param(
        {"obs": ("f4,(", (4,))}, ["'obs'", "not a tuple of ints"], id="unparsable_dtype_first"
    ),
    pytest.param(
        {"obs": [(4,), "float32"]}, ["'obs'", "(shape, dtype) tuple"], id="list_not_tuple"
    ),
    pytest.param({"obs": ((4,),)}, ["'obs'", "(shape, dtype) tuple"], id="shape_without_dtype"),
    pytest.param({}, ["non-empty", "e.g. {'obs'"], id="empty_signature"),
    pytest.param({"obs": {}}, ["'obs'", "is empty (a dict"], id="empty_nested_dict"),
    pytest.param({"obs": {"image": {}}}, ["'obs/image'", "is empty (a dict"], id="deep_empty_dict"),
    pytest.param([("obs", "float32")], ["non-empty dict"], id="list_of_pairs"),
    pytest.param(
        np.zeros(4, np.float32), ["non-empty dict", "one field's spec", "{'obs': spec}"],
        id="one_fields_spec_unnamed",
    ),
]


@pytest.mark.parametrize("signature, words", BAD_SIGNATURES)
def test_a_signature_mistake_is_refused_when_the_table_is_built(signature, words):
    for build in (
        lambda: Signature(signature),
        lambda: rr.Table("x", signature=signature, max_size=5),
    ):
        with pytest.raises(InvalidArgumentError) as caught:
            build()
        message = str(caught.value)
        assert "\n" not in message
        for word in words:
            assert word in message, (word, message)


# (shape, dtype) given to FieldSpec, words the message must hold
BAD_FIELD_SPECS = [
    pytest.param("float32", (4,), ["shape='float32'", "((4,), 'float32')"], id="swapped"),
    pytest.param((2, -3), "uint8", ["-3", "int >= 0"], id="negative_dim"),
    pytest.param((2, 3.0), "uint8", ["3.0", "int >= 0"], id="float_dim"),
    pytest.param(None, "uint8", ["shape=None", "tuple of ints"], id="shape_none"),
    pytest.param((4,), ("float32", (4,)), ["not one dtype"], id="tuple_dtype"),
    pytest.param((4,), "(2,)i8", ["subarray", "((4, 2), 'int64')"], id="subarray_dtype"),
    pytest.param((), "i4,i4", ["structured"], id="structured_dtype"),
    pytest.param((), object, ["Python objects"], id="object_dtype"),
    pytest.param((), str, ["no length"], id="str_without_length"),
]


@pytest.mark.parametrize("shape, dtype, words", BAD_FIELD_SPECS)
def test_field_spec_refuses_what_numpy_would_reinterpret(shape, dtype, words):
    with pytest.raises(InvalidArgumentError) as caught:
        FieldSpec(shape, dtype)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


GOOD_SIGNATURES = [
    pytest.param({"obs": ((4,), "float32")}, {"obs": ((4,), "float32")}, id="shape_dtype"),
    pytest.param({"obs": (4, "float32")}, {"obs": ((4,), "float32")}, id="int_shape"),
    pytest.param(
        {"obs": ((np.int64(2), 3), np.uint8)}, {"obs": ((2, 3), "uint8")}, id="numpy_ints"
    ),
    pytest.param({"r": "float32"}, {"r": ((), "float32")}, id="scalar_dtype_string"),
    pytest.param({"r": float}, {"r": ((), "float64")}, id="python_float"),
    pytest.param({"r": ">f4"}, {"r": ((), ">f4")}, id="byte_swapped"),
    pytest.param({"s": "U8"}, {"s": ((), "<U8")}, id="string_with_length"),
    pytest.param({"t": "M8[s]"}, {"t": ((), "M8[s]")}, id="datetime_with_unit"),
    pytest.param({"o": np.zeros((2, 0), "i2")}, {"o": ((2, 0), "int16")}, id="array_example"),
    pytest.param(
        {"obs": {"image": ((8, 8), "uint8")}}, {"obs/image": ((8, 8), "uint8")}, id="nested"
    ),
]


@pytest.mark.parametrize("signature, expected", GOOD_SIGNATURES)
def test_ordinary_signatures_are_still_accepted(signature, expected):
    sig = Signature(signature)
    assert {p: (s.shape, s.dtype) for p, s in sig.fields.items()} == {
        p: (shape, np.dtype(dt)) for p, (shape, dt) in expected.items()
    }
    assert Signature.from_json(sig.to_json()) == sig


def test_a_swapped_spec_no_longer_builds_a_table_that_fails_only_at_insert():
    # Before, this built a column of subarray dtype and shape (), refused by every insert.
    with pytest.raises(InvalidArgumentError, match=r"give \(shape, dtype\)"):
        rr.Table("x", signature={"obs": ("float32", (4,))}, max_size=5)
    table = rr.Table("x", signature={"obs": ((4,), "float32")}, max_size=5)
    table.insert({"obs": np.ones((2, 4), np.float32)})
    assert table.sample(2).data["obs"].shape == (2, 4)


# ------------------------------------------------------------------ item layouts


@pytest.mark.parametrize(
    "build, expected_span",
    [
        pytest.param(lambda s: ItemLayout.transition(s), 2, id="transition"),
        pytest.param(lambda s: ItemLayout.transition(s, n_step=3), 4, id="n_step"),
        pytest.param(lambda s: ItemLayout.transition(s, next_fields="obs"), 2, id="one_field"),
        pytest.param(lambda s: ItemLayout.rows(s), 1, id="rows"),
        pytest.param(lambda s: ItemLayout.sequence(s, 3), 3, id="sequence"),
        pytest.param(lambda s: ItemLayout({"o": Window("obs", 1)}, s), 2, id="init"),
    ],
)
def test_item_layouts_take_a_signature_dict_as_its_signature(build, expected_span):
    from_dict, from_signature = build(SIG), build(Signature(SIG))
    assert isinstance(from_dict.signature, Signature)
    assert from_dict.signature == from_signature.signature
    assert from_dict.windows == from_signature.windows
    assert from_dict.span == expected_span


def test_a_layout_built_from_the_dict_serves_the_table_of_that_signature():
    store = rr.StepStore(SIG, capacity=16)
    table = rr.Table("t", store=store, layout=ItemLayout.transition(SIG))
    with rr.TrajectoryWriter(table) as writer:
        writer.append({"obs": np.zeros(4), "action": 0, "reward": 0.0})
        writer.append({"obs": np.ones(4), "action": 1, "reward": 1.0})
        writer.create_item(table)
    np.testing.assert_array_equal(table.sample(1).data["next_obs"], np.ones((1, 4)))


def test_a_field_named_twice_in_next_fields_gets_one_next_window():
    layout = ItemLayout.transition({"obs": ((2,), "float32")}, next_fields=("obs", "obs"))
    assert sorted(layout.windows) == ["next_obs", "obs"]


@pytest.mark.parametrize(
    "build, words",
    [
        pytest.param(lambda: ItemLayout.transition([1, 2]), ["signature=[1, 2]"], id="list"),
        pytest.param(lambda: ItemLayout.rows(None), ["signature=None"], id="none"),
        pytest.param(lambda: ItemLayout.sequence("obs", 2), ["signature='obs'"], id="str"),
        pytest.param(
            lambda: ItemLayout.transition({"obs": ("float32", (4,))}),
            ["'obs'", "give (shape, dtype)"],
            id="bad_dict",
        ),
        pytest.param(lambda: ItemLayout.transition(SIG, n_step=0), ["n_step=0"], id="n_step_0"),
        pytest.param(
            lambda: ItemLayout.transition(SIG, n_step=1.5), ["n_step=1.5"], id="n_step_float"
        ),
        pytest.param(lambda: ItemLayout.sequence(SIG, True), ["length=True"], id="bool_length"),
        pytest.param(
            lambda: ItemLayout.transition(
                {"obs": ((2,), "float32"), "next_obs": ((2,), "float32")}
            ),
            ["next_prefix='next_'", "'next_obs'", "also a stored field"],
            id="next_shadows_a_field",
        ),
        pytest.param(
            lambda: ItemLayout.transition(
                {"obs": ((2,), "float32"), "next_obs": {"x": ((2,), "float32")}}
            ),
            ["'next_obs'", "also a stored field or branch"],
            id="next_shadows_a_branch",
        ),
        pytest.param(lambda: ItemLayout([], SIG), ["windows=[]"], id="windows_list"),
        pytest.param(
            lambda: ItemLayout({"o": Window("obs", offset=0.5)}, SIG),
            ["'o'", "offset=0.5"],
            id="float_offset",
        ),
    ],
)
def test_item_layout_mistakes_raise_naming_the_argument(build, words):
    with pytest.raises(InvalidArgumentError) as caught:
        build()
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_a_gymnasium_space_given_as_the_signature_is_refused_naming_from_spaces():
    gym = pytest.importorskip("gymnasium")
    with pytest.raises(InvalidArgumentError) as caught:
        rr.Table("x", signature=gym.spaces.Box(-1, 1, (3,)), max_size=5)
    message = str(caught.value)
    assert "signature=Box(" in message and "Signature.from_spaces(" in message


def test_an_environment_given_for_a_space_is_named_as_one():
    gym = pytest.importorskip("gymnasium")
    env = gym.make("CartPole-v1")
    with pytest.raises(InvalidArgumentError, match="is an environment, not a space"):
        Signature.from_spaces(env, env.action_space)
    env.close()


def test_the_config_file_form_of_a_field_points_at_the_python_form():
    with pytest.raises(InvalidArgumentError, match=r"form of config files: in Python give"):
        Signature({"x": {"shape": [3], "dtype": "float32"}})


def test_an_empty_tuple_space_is_named_empty_not_a_dict():
    gym = pytest.importorskip("gymnasium")
    with pytest.raises(InvalidArgumentError, match="is empty"):
        Signature({"x": gym.spaces.Tuple(())})


@pytest.mark.parametrize(
    ("rows", "said"),
    [({"obs": np.zeros((1, 4), np.float32), "action": 1, "reward": 1.0},
      "one row, where the fields before it hold a batch of 1"),
     ({"obs": np.zeros(4, np.float32), "action": np.array([1]), "reward": 1.0},
      "a batch, where the first field holds one row")],
    ids=["batch-then-row", "row-then-batch"],
)
def test_rows_mixing_one_row_and_a_batch_say_so(rows, said):
    table = rr.Table("t", signature=SIG, max_size=8)
    with pytest.raises(rr.SignatureError, match=said):
        table.insert(rows)
    assert table.size == 0
