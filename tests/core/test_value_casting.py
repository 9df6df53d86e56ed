"""Values that do not fit their column are refused, by one rule, on every path.

The rule (rlreplay/core/value_casting.py): a value is stored when it converts to its column's dtype
without changing in kind or in value. Each named case is written as a Python or numpy
scalar or a zero-dimensional array, one row at a time and as a batch, through the compiled
store write and through the numpy path: the stored values, or the error, must agree.
Columns the compiled write does not handle (complex, byte-swapped, datetime, strings) fall
back to the numpy path instead of failing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlreplay import StepStore, Table
from rlreplay.core import storage
from rlreplay.errors import SignatureError

SIGNATURE = {
    "i32": "int32",
    "u8": "uint8",
    "i64": "int64",
    "u64": "uint64",
    "f32": "float32",
    "f64": "float64",
    "flag": "bool",
    "z": "complex128",
}
GOOD = {
    "i32": 1,
    "u8": 2,
    "i64": 3,
    "u64": 4,
    "f32": 0.5,
    "f64": 0.25,
    "flag": False,
    "z": 1j,
}

# name: (field, value, the value the column holds afterwards)
ACCEPTED = {
    "bool-into-int32": ("i32", True, 1),
    "numpy-bool-into-float32": ("f32", np.bool_(True), 1.0),
    "bool-into-complex": ("z", True, 1.0),
    "int-into-float32": ("f32", 3, 3.0),
    "int-into-float64-rounded": ("f64", 2**70 + 1, 2.0**70),
    "numpy-int64-into-uint8-at-max": ("u8", np.int64(255), 255),
    "int-into-int32-at-max": ("i32", 2**31 - 1, 2**31 - 1),
    "int-into-int32-at-min": ("i32", -(2**31), -(2**31)),
    "int-into-uint64-above-int64": ("u64", 2**63, 2**63),
    "int-into-uint64-at-max": ("u64", 2**64 - 1, 2**64 - 1),
    "numpy-uint64-into-int64": ("i64", np.uint64(5), 5),
    "numpy-int8-into-uint8": ("u8", np.int8(7), 7),
    "numpy-uint32-into-float32": ("f32", np.uint32(9), 9.0),
    "float-into-float32-rounded": ("f32", 0.1, np.float32(0.1)),
    "numpy-float64-into-float32": ("f32", np.float64(1.5), 1.5),
    "numpy-float32-into-float64": ("f64", np.float32(0.1), float(np.float32(0.1))),
    "numpy-float16-into-float32": ("f32", np.float16(0.5), 0.5),
    "int-into-complex": ("z", 2, 2.0),
    "float-into-complex": ("z", 1.5, 1.5),
    "complex-into-complex": ("z", 1 + 2j, 1 + 2j),
    "zero-d-int8-array-into-int32": ("i32", np.array(-5, np.int8), -5),
    "zero-d-int64-array-into-uint8": ("u8", np.array(7), 7),
    "numpy-bool-into-bool": ("flag", np.bool_(True), True),
    # infinities and NaN are themselves in float32; the largest float32 fits
    "float-inf-into-float32": ("f32", float("inf"), np.inf),
    "numpy-float64-minus-inf-into-float32": ("f32", np.float64(-np.inf), -np.inf),
    "largest-float32-as-float64": (
        "f32",
        float(np.finfo(np.float32).max),
        np.finfo(np.float32).max,
    ),
}
# name: (field, value, text the error must contain besides the field and the dtype)
REFUSED = {
    "int-2**40-into-int32": ("i32", 2**40, str(2**40)),
    "int-300-into-uint8": ("u8", 300, "300"),
    "numpy-int64-300-into-uint8": ("u8", np.int64(300), "300"),
    "zero-d-array-300-into-uint8": ("u8", np.array(300), "300"),
    "negative-int-into-uint8": ("u8", -1, "-1"),
    "negative-numpy-int-into-uint64": ("u64", np.int64(-1), "-1"),
    "numpy-uint64-above-int64": ("i64", np.uint64(2**63), str(2**63)),
    "int-2**64-into-uint64": ("u64", 2**64, str(2**64)),
    "int-2**70-into-int64": ("i64", 2**70, str(2**70)),
    "float-into-int32": ("i32", 1.0, "float64"),
    "numpy-float64-into-int64": ("i64", np.float64(2.0), "float64"),
    "numpy-float32-into-int64": ("i64", np.float32(2.0), "float32"),
    "float-into-bool": ("flag", 0.0, "float64"),
    "int-into-bool": ("flag", 1, "int64"),
    "complex-into-float64": ("f64", 1 + 0j, "complex128"),
    "numpy-complex-into-float32": ("f32", np.complex64(1), "complex64"),
    # a finite value beyond float32's range would become inf
    "float-beyond-float32": ("f32", 1e300, "inf"),
    "numpy-float64-beyond-float32-below": ("f32", np.float64(-1e300), "inf"),
    # so would an integer beyond it
    "int-10**40-into-float32": ("f32", 10**40, "inf"),
    "negative-int-10**40-into-float32": ("f32", -(10**40), "inf"),
    "int-10**400-into-float64": ("f64", 10**400, "inf"),
}
# RLREPLAY_NO_EXTENSION=1 leaves the numpy path only
PATHS = ["compiled", "numpy"] if storage._kernel is not None else ["numpy"]


def make_table(path: str) -> Table:
    """A table alone on its store, writing through the compiled write or without it."""
    table = Table("t", signature=SIGNATURE, max_size=8)
    if path == "compiled":
        assert table.store.compiled_writes
    else:
        table.store.compiled_writes = False
    return table


def as_batch(value: Any, n: int = 3) -> Any:
    """``n`` rows of ``value``: an array of its dtype, or a list of Python scalars."""
    if isinstance(value, (np.generic, np.ndarray)):
        return np.repeat(np.asarray(value)[None], n, axis=0)
    return [value] * n


def write(table: Table, field: str, value: Any, batch: bool) -> None:
    if batch:
        rows = {k: as_batch(v) for k, v in GOOD.items()}
        rows[field] = as_batch(value)
    else:
        rows = dict(GOOD, **{field: value})
    table.insert(rows)


@pytest.mark.filterwarnings("error")  # no path warns about what it stores
@pytest.mark.parametrize("batch", [False, True], ids=["one-row", "batch"])
@pytest.mark.parametrize("field, value, stored", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_a_value_that_fits_its_column_is_stored_unchanged_on_every_path(
    field, value, stored, batch
):
    results = []
    for path in PATHS:
        table = make_table(path)
        write(table, field, value, batch)
        column = table.store.columns[field]
        n = table.store.next_id
        assert (column[:n] == np.asarray(stored, dtype=column.dtype)).all(), path
        results.append({k: c[:n].copy() for k, c in table.store.columns.items()})
    for k in SIGNATURE:
        np.testing.assert_array_equal(results[0][k], results[-1][k])


@pytest.mark.parametrize("batch", [False, True], ids=["one-row", "batch"])
@pytest.mark.parametrize("field, value, text", REFUSED.values(), ids=REFUSED.keys())
def test_a_value_that_does_not_fit_is_refused_alike_on_every_path(field, value, text, batch):
    messages = []
    for path in PATHS:
        table = make_table(path)
        table.insert(GOOD)
        before = {k: c.copy() for k, c in table.store.columns.items()}
        with pytest.raises(SignatureError) as info:
            write(table, field, value, batch)
        message = str(info.value)
        assert repr(field) in message and SIGNATURE[field] in message and text in message
        messages.append(message)
        assert table.store.next_id == 1 and len(table) == 1
        for k, c in table.store.columns.items():
            np.testing.assert_array_equal(c, before[k])
    assert messages[0] == messages[-1]


@pytest.mark.parametrize("field, value, text", REFUSED.values(), ids=REFUSED.keys())
def test_a_store_append_refuses_what_an_insert_refuses(field, value, text):
    store = StepStore(SIGNATURE, capacity=8)
    rows = {k: as_batch(v) for k, v in GOOD.items()}
    rows[field] = as_batch(value)
    with pytest.raises(SignatureError, match=repr(field)):
        store.append(rows)
    assert store.next_id == 0


def test_integer_arrays_are_checked_for_their_range_element_by_element():
    table = make_table("numpy")
    table.insert({**{k: as_batch(v, 4) for k, v in GOOD.items()}, "u8": np.arange(252, 256)})
    with pytest.raises(SignatureError, match="256, outside the range"):
        table.insert({**{k: as_batch(v, 4) for k, v in GOOD.items()}, "u8": np.arange(253, 257)})
    np.testing.assert_array_equal(table.store.columns["u8"][:4], np.arange(252, 256))


# Columns whose element types the compiled write does not handle: it must leave them to
# the numpy path rather than fail, so a store of them works with and without it.
OTHER_COLUMNS = {
    "complex64": ("complex64", np.complex64(1 - 2j)),
    "complex128-array": (((2,), "complex128"), np.array([1j, 2], np.complex128)),
    "big-endian-float32": (">f4", np.float32(1.25)),
    "big-endian-int64": (((3,), ">i8"), np.array([1, -2, 3], ">i8")),
    "little-endian-array-into-big-endian": (((3,), ">i8"), np.array([4, 5, 6])),
    "datetime64": ("datetime64[ns]", np.datetime64("2024-05-01T12:00:00", "ns")),
    "timedelta64": ("timedelta64[s]", np.timedelta64(90, "s")),
    "bytes": ("S4", np.bytes_(b"ab")),
    "float16": ("float16", np.float16(0.5)),
}


@pytest.mark.parametrize("batch", [False, True], ids=["one-row", "batch"])
@pytest.mark.parametrize("spec, value", OTHER_COLUMNS.values(), ids=OTHER_COLUMNS.keys())
def test_columns_the_compiled_write_does_not_handle_fall_back_to_numpy(spec, value, batch):
    stored = []
    for path in PATHS:
        table = Table("t", signature={"x": spec, "n": "int64"}, max_size=4)
        table.store.compiled_writes = path == "compiled"
        for i in range(6):  # past the capacity: the ring wraps
            if batch:
                table.insert({"x": as_batch(value, 2), "n": np.arange(2) + i})
            else:
                table.insert({"x": value, "n": i})
        sample = table.sample(4)
        assert (sample.data["x"] == np.asarray(value)).all()
        stored.append(table.store.columns["x"].copy())
    np.testing.assert_array_equal(stored[0], stored[-1])


def test_a_datetime_value_is_stored_only_in_a_unit_that_holds_it():
    table = Table("t", signature={"t": "datetime64[ms]"}, max_size=4)
    table.insert({"t": np.datetime64("2024-05-01T12:00:00", "s")})  # seconds -> ms: exact
    with pytest.raises(SignatureError, match="datetime64"):
        table.insert({"t": np.datetime64("2024-05-01T12:00:00.001", "us")})  # would truncate
    assert table.store.next_id == 1


# (name, column dtype, value, stored or None for refused)
OVERFLOW_EDGES = [
    ("float64-rounding-to-largest-float32", "float32", 3.4028235e38, np.finfo(np.float32).max),
    ("float64-just-past-float32", "float32", 3.403e38, None),
    ("complex-beyond-complex64", "complex64", 1e40, None),
    ("imaginary-part-beyond-complex64", "complex64", complex(0, -1e40), None),
    ("float-beyond-float16", "float16", 70000.0, None),
    ("float-within-float16", "float16", 60000.0, np.float16(60000.0)),
    ("inf-into-complex64", "complex64", complex(np.inf, 1.0), complex(np.inf, 1.0)),
    ("int-beyond-float16", "float16", 70000, None),
    ("numpy-int64-beyond-float16", "float16", np.int64(-70000), None),
    ("int-rounding-to-largest-float16", "float16", 65519, np.float16(65504)),
    ("int-within-float16", "float16", 60000, np.float16(60000)),
    ("int-beyond-complex64", "complex64", 10**40, None),
    ("uint64-max-into-float32", "float32", np.uint64(2**64 - 1), np.float32(2.0**64)),
]


@pytest.mark.parametrize(
    "dtype,value,stored", [c[1:] for c in OVERFLOW_EDGES], ids=[c[0] for c in OVERFLOW_EDGES]
)
@pytest.mark.parametrize("batch", [False, True], ids=["one-row", "batch"])
def test_a_finite_value_is_refused_exactly_when_its_column_would_make_it_inf(
    dtype, value, stored, batch
):
    table = Table("t", signature={"x": dtype}, max_size=4)
    rows = {"x": np.array([value]) if batch else value}
    if stored is None:
        with pytest.raises(SignatureError, match="inf"):
            table.insert(rows)
        assert table.size == 0
    else:
        table.insert(rows)
        assert table.sample(1).data["x"][0] == stored
