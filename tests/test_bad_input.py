"""Bad input: each case gets a typed error naming the argument and changes nothing stored."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import ROW_SIGNATURE, rows

import rlreplay as rr
from rlreplay import (
    DeadlockError,
    Fifo,
    InvalidArgumentError,
    ItemLayout,
    MinSize,
    Prioritized,
    SampleToInsertRatio,
    SignatureError,
    StepStore,
    Table,
    TrajectoryWriter,
    Uniform,
    Window,
    learn_while_can_sample,
)

MAX_SIZE = 8


def filled_table():
    table = Table(
        "t",
        signature=ROW_SIGNATURE,
        max_size=MAX_SIZE,
        capacity=MAX_SIZE,
        sampler=Prioritized(0.7),
        seed=0,
    )
    keys = table.insert(rows(0, 5), priorities=[1.0, 2.0, 3.0, 4.0, 5.0])
    table.sample(3)
    return table, keys


def snapshot(table):
    """Everything a rejected call must leave unchanged: data, items, indexes, counters."""
    info = table.info().to_dict()
    state = {
        "info": info,
        "next_id": table.store.next_id,
        "columns": {p: c.copy() for p, c in table.store.columns.items()},
        "priority": table.index.priority.copy(),
        "live": table.index.live.copy(),
        "generation": table.index.generation.copy(),
        "times_sampled": table.index.times_sampled.copy(),
        "sampler": {k: np.copy(v) for k, v in table.sampler.state().items()},
        "rng": table.rng.bit_generator.state,
    }
    return state


def assert_same(a, b):
    assert a["info"] == b["info"]
    assert a["next_id"] == b["next_id"]
    for p in a["columns"]:
        np.testing.assert_array_equal(a["columns"][p], b["columns"][p])
    for k in ("priority", "live", "generation", "times_sampled"):
        np.testing.assert_array_equal(a[k], b[k])
    for k in a["sampler"]:
        np.testing.assert_array_equal(a["sampler"][k], b["sampler"][k])
    assert a["rng"] == b["rng"]


def stale_and_unissued_key(keys):
    slot = int(keys[0]) & 0xFFFFFFFF
    return np.array([(7 << 32) | slot], dtype=np.int64)


@dataclass
class Bad:
    name: str
    call: object  # (table, keys) -> None
    error: type
    words: tuple


def bad_rows(**changes):
    data = rows(10, 2)
    for k, v in changes.items():
        if v is None:
            del data[k]
        else:
            data[k] = v
    return data


CASES = [
    # --- rows
    Bad(
        "insert unknown field",
        lambda t, k: t.insert({**rows(10, 2), "stp": np.zeros(2)}),
        SignatureError,
        ("stp",),
    ),
    Bad(
        "insert missing field", lambda t, k: t.insert(bad_rows(obs=None)), SignatureError, ("obs",)
    ),
    Bad(
        "insert one row with a float beyond float32",
        lambda t, k: t.insert({"step": 3, "obs": np.array([0.0, 1e40, 0.0])}),
        SignatureError,
        ("'obs'", "1e+40", "inf"),
    ),
    Bad(
        "insert rows with a float beyond float32",
        lambda t, k: t.insert(bad_rows(obs=np.full((2, 3), -1e39))),
        SignatureError,
        ("'obs'", "-1e+39", "inf"),
    ),
    Bad(
        "insert ragged lists",
        lambda t, k: t.insert(bad_rows(obs=[[0.0, 0.0, 0.0], [1.0, 1.0]])),
        SignatureError,
        ("'obs'", "one array"),
    ),
    Bad(
        "insert one row of ragged lists",
        lambda t, k: t.insert({"step": 3, "obs": [0.0, 0.0, [1.0]]}),
        SignatureError,
        ("'obs'", "one array"),
    ),
    Bad(
        "insert wrong trailing shape",
        lambda t, k: t.insert(bad_rows(obs=np.zeros((2, 4)))),
        SignatureError,
        ("obs", "(3,)"),
    ),
    Bad(
        "insert float into int field",
        lambda t, k: t.insert(bad_rows(step=np.zeros(2))),
        SignatureError,
        ("step", "float64"),
    ),
    Bad(
        "insert batch sizes differ",
        lambda t, k: t.insert(bad_rows(step=np.zeros(3, np.int64))),
        SignatureError,
        ("batch",),
    ),
    Bad("insert not a dict", lambda t, k: t.insert([1, 2, 3]), SignatureError, ("rows",)),
    Bad(
        "insert more rows than max_size",
        lambda t, k: t.insert(rows(10, MAX_SIZE + 1)),
        InvalidArgumentError,
        ("max_size",),
    ),
    Bad("insert zero rows", lambda t, k: t.insert(rows(10, 0)), InvalidArgumentError, ("rows",)),
    # --- priorities
    Bad(
        "insert NaN priority",
        lambda t, k: t.insert(rows(10, 2), priorities=[1.0, np.nan]),
        InvalidArgumentError,
        ("priorities", "nan"),
    ),
    Bad(
        "insert negative priority",
        lambda t, k: t.insert(rows(10, 2), priorities=[-1.0, 1.0]),
        InvalidArgumentError,
        ("priorities", "-1.0"),
    ),
    Bad(
        "insert infinite priority",
        lambda t, k: t.insert(rows(10, 2), priorities=np.inf),
        InvalidArgumentError,
        ("priorities", "inf"),
    ),
    Bad(
        "insert priorities wrong length",
        lambda t, k: t.insert(rows(10, 2), priorities=[1.0]),
        InvalidArgumentError,
        ("priorities", "2"),
    ),
    Bad(
        "insert priorities 2-d",
        lambda t, k: t.insert(rows(10, 2), priorities=np.ones((2, 1))),
        InvalidArgumentError,
        ("priorities",),
    ),
    Bad(
        "update NaN priority",
        lambda t, k: t.update_priorities(k[:2], [np.nan, 1.0]),
        InvalidArgumentError,
        ("priorities", "nan"),
    ),
    Bad(
        "update negative priority",
        lambda t, k: t.update_priorities(k[:1], [-0.5]),
        InvalidArgumentError,
        ("priorities",),
    ),
    Bad(
        "update infinite priority",
        lambda t, k: t.update_priorities(k[:1], [np.inf]),
        InvalidArgumentError,
        ("priorities", "inf"),
    ),
    Bad(
        "update priorities wrong length",
        lambda t, k: t.update_priorities(k[:3], [1.0, 2.0]),
        InvalidArgumentError,
        ("priorities", "3"),
    ),
    # --- keys
    Bad(
        "update float keys",
        lambda t, k: t.update_priorities(k.astype(float), np.ones(5)),
        InvalidArgumentError,
        ("keys",),
    ),
    Bad(
        "update negative key",
        lambda t, k: t.update_priorities([-3], [1.0]),
        InvalidArgumentError,
        ("keys", "-3"),
    ),
    Bad(
        "update key of a slot the table lacks",
        lambda t, k: t.update_priorities([MAX_SIZE], [1.0]),
        InvalidArgumentError,
        ("keys",),
    ),
    Bad(
        "update key never issued",
        lambda t, k: t.update_priorities(stale_and_unissued_key(k), [1.0]),
        InvalidArgumentError,
        ("keys",),
    ),
    Bad(
        "update mixed good and unknown keys",
        lambda t, k: t.update_priorities(np.r_[k[:2], stale_and_unissued_key(k)], np.ones(3)),
        InvalidArgumentError,
        ("keys",),
    ),
    Bad(
        "delete 2-d keys", lambda t, k: t.delete(k.reshape(1, -1)), InvalidArgumentError, ("keys",)
    ),
    Bad(
        "delete key never issued",
        lambda t, k: t.delete(stale_and_unissued_key(k)),
        InvalidArgumentError,
        ("keys",),
    ),
    Bad("delete string keys", lambda t, k: t.delete(["a"]), InvalidArgumentError, ("keys",)),
    # --- timeouts
    Bad(
        "insert timeout zero",
        lambda t, k: t.insert(rows(10, 1), timeout=0),
        InvalidArgumentError,
        ("timeout",),
    ),
    Bad(
        "insert timeout negative",
        lambda t, k: t.insert(rows(10, 1), timeout=-1.0),
        InvalidArgumentError,
        ("timeout",),
    ),
    Bad(
        "sample timeout zero",
        lambda t, k: t.sample(1, timeout=0.0),
        InvalidArgumentError,
        ("timeout",),
    ),
    Bad(
        "sample timeout string",
        lambda t, k: t.sample(1, timeout="1"),
        InvalidArgumentError,
        ("timeout",),
    ),
    Bad(
        "sample timeout NaN",
        lambda t, k: t.sample(1, timeout=float("nan")),
        InvalidArgumentError,
        ("timeout",),
    ),
    # --- batch sizes
    Bad("sample zero", lambda t, k: t.sample(0), InvalidArgumentError, ("batch_size",)),
    Bad("sample negative", lambda t, k: t.sample(-2), InvalidArgumentError, ("batch_size",)),
    Bad("sample float", lambda t, k: t.sample(2.0), InvalidArgumentError, ("batch_size",)),
    Bad("sample bool", lambda t, k: t.sample(True), InvalidArgumentError, ("batch_size",)),
    Bad(
        "sample more than max_size",
        lambda t, k: t.sample(MAX_SIZE + 1),
        InvalidArgumentError,
        ("batch_size", "max_size"),
    ),
    # --- what can_sample and can_insert are asked about: what sample and insert refuse
    Bad("can_sample zero", lambda t, k: t.can_sample(0), InvalidArgumentError, ("num_samples",)),
    Bad(
        "can_sample more than max_size",
        lambda t, k: t.can_sample(MAX_SIZE + 1),
        InvalidArgumentError,
        ("num_samples", "max_size"),
    ),
    Bad("can_sample str", lambda t, k: t.can_sample("a"), InvalidArgumentError, ("num_samples",)),
    Bad("can_insert zero", lambda t, k: t.can_insert(0), InvalidArgumentError, ("num_inserts",)),
    Bad("can_insert str", lambda t, k: t.can_insert("a"), InvalidArgumentError, ("num_inserts",)),
    Bad(
        "learn_while_can_sample without a callable",
        lambda t, k: learn_while_can_sample(t, 2, None, 5),
        InvalidArgumentError,
        ("learn", "callable"),
    ),
    # --- importance weights (the table is untouched: the batch is drawn before the case)
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_rejected_and_changes_nothing(case):
    table, keys = filled_table()
    before = snapshot(table)
    with pytest.raises(case.error) as err:
        case.call(table, keys)
    message = str(err.value)
    for word in case.words:
        assert word in message, f"{word!r} not in {message!r}"
    assert_same(before, snapshot(table))
    # The table still works after the rejected call.
    table.insert(rows(20, 1), priorities=[1.0])
    assert len(table.sample(2)) == 2


WEIGHTS = [
    ("beta above one", dict(beta=1.5), "beta"),
    ("beta negative", dict(beta=-0.1), "beta"),
    ("beta NaN", dict(beta=float("nan")), "beta"),
    ("unknown normalisation", dict(beta=0.5, normalize="max"), "normalize"),
]


@pytest.mark.parametrize("kwargs,word", [c[1:] for c in WEIGHTS], ids=[c[0] for c in WEIGHTS])
def test_bad_importance_weight_arguments(kwargs, word):
    table, _ = filled_table()
    batch = table.sample(4)
    with pytest.raises(InvalidArgumentError, match=word):
        batch.importance_weights(**kwargs)


def make(**kwargs):
    kwargs.setdefault("signature", ROW_SIGNATURE)
    return Table("t", **kwargs)


CONSTRUCTOR = [
    (
        "empty name",
        lambda: Table("", signature=ROW_SIGNATURE, max_size=4),
        InvalidArgumentError,
        "name",
    ),
    (
        "neither signature nor store",
        lambda: Table("t", max_size=4),
        InvalidArgumentError,
        "signature",
    ),
    (
        "signature without size",
        lambda: Table("t", signature=ROW_SIGNATURE),
        InvalidArgumentError,
        "max_size",
    ),
    ("max_size zero", lambda: make(max_size=0, capacity=4), InvalidArgumentError, "max_size"),
    (
        "max_size above capacity",
        lambda: make(max_size=9, capacity=8),
        InvalidArgumentError,
        "max_size",
    ),
    (
        "max_times_sampled negative",
        lambda: make(max_size=4, max_times_sampled=-1),
        InvalidArgumentError,
        "max_times_sampled",
    ),
    (
        "unknown on_overwrite",
        lambda: make(max_size=4, on_overwrite="drop"),
        InvalidArgumentError,
        "on_overwrite",
    ),
    (
        "default_priority NaN",
        lambda: make(max_size=4, default_priority=float("nan")),
        InvalidArgumentError,
        "default_priority",
    ),
    (
        "default_priority negative",
        lambda: make(max_size=4, default_priority=-1.0),
        InvalidArgumentError,
        "default_priority",
    ),
    (
        "sampler is the remover",
        lambda: make(max_size=4, sampler=(s := Fifo()), remover=s),
        InvalidArgumentError,
        "sampler",
    ),
    (
        "sampler not a selector",
        lambda: make(max_size=4, sampler="uniform"),
        InvalidArgumentError,
        "sampler",
    ),
    (
        "remover not a selector",
        lambda: make(max_size=4, remover=Fifo),
        InvalidArgumentError,
        "remover",
    ),
    (
        "rate_limiter not a limiter",
        lambda: make(max_size=4, rate_limiter=1.0),
        InvalidArgumentError,
        "rate_limiter",
    ),
    (
        "min size above max_size",
        lambda: make(max_size=4, rate_limiter=MinSize(5)),
        DeadlockError,
        "min_size_to_sample",
    ),
    (
        "ratio needs more samples than max_times_sampled allows",
        lambda: make(
            max_size=8, max_times_sampled=1, rate_limiter=SampleToInsertRatio(2.0, 1, 4.0)
        ),
        DeadlockError,
        "max_times_sampled",
    ),
    (
        "signature differs from store",
        lambda: Table("t", signature={"a": "float32"}, store=StepStore(ROW_SIGNATURE, 4)),
        InvalidArgumentError,
        "signature",
    ),
    (
        "layout for another signature",
        lambda: Table(
            "t",
            store=StepStore(ROW_SIGNATURE, 4),
            layout=ItemLayout.rows(StepStore({"a": "float32"}, 4).signature),
        ),
        InvalidArgumentError,
        "layout",
    ),
    (
        "item longer than the store",
        lambda: Table(
            "t",
            store=(st := StepStore(ROW_SIGNATURE, 4)),
            layout=ItemLayout.sequence(st.signature, 5),
        ),
        InvalidArgumentError,
        "span",
    ),
    (
        "layout window on unknown column",
        lambda: ItemLayout({"x": Window("nope")}, StepStore(ROW_SIGNATURE, 4).signature),
        InvalidArgumentError,
        "nope",
    ),
    (
        "layout negative offset",
        lambda: ItemLayout({"x": Window("obs", -1)}, StepStore(ROW_SIGNATURE, 4).signature),
        InvalidArgumentError,
        "offset",
    ),
    (
        "priority_exponent negative",
        lambda: Prioritized(-0.5),
        InvalidArgumentError,
        "priority_exponent",
    ),
    (
        "priority_exponent NaN",
        lambda: Prioritized(float("nan")),
        InvalidArgumentError,
        "priority_exponent",
    ),
    ("store capacity zero", lambda: StepStore(ROW_SIGNATURE, 0), InvalidArgumentError, "capacity"),
    (
        "store capacity not a multiple of lanes",
        lambda: StepStore(ROW_SIGNATURE, 5, lanes=2),
        InvalidArgumentError,
        "capacity",
    ),
    ("signature empty", lambda: StepStore({}, 4), InvalidArgumentError, "signature"),
    (
        "signature bad dtype",
        lambda: StepStore({"a": ((2,), "no-such-dtype")}, 4),
        InvalidArgumentError,
        "dtype",
    ),
    (
        "signature object dtype",
        lambda: StepStore({"a": ((2,), object)}, 4),
        InvalidArgumentError,
        "dtype",
    ),
    ("writer with no tables", lambda: TrajectoryWriter([]), InvalidArgumentError, "tables"),
    ("writer of None", lambda: TrajectoryWriter(None), InvalidArgumentError, "tables"),
    (
        "prioritized exponent as a string",
        lambda: Prioritized("0.6"),
        InvalidArgumentError,
        "priority_exponent",
    ),
    (
        "signature field that is also a branch",
        lambda: StepStore({"a/b": "float32", "a": "int64"}, 4),
        InvalidArgumentError,
        "'a' is both a field and a branch",
    ),
    (
        "signature nested field that is also a branch",
        lambda: StepStore({"obs": {"x": "float32", "x/y": "int64"}}, 4),
        InvalidArgumentError,
        "'obs/x' is both a field and a branch",
    ),
    (
        "writer history below span",
        lambda: TrajectoryWriter(
            Table(
                "t",
                store=(st := StepStore(ROW_SIGNATURE, 8)),
                layout=ItemLayout.sequence(st.signature, 3),
            ),
            history=2,
        ),
        InvalidArgumentError,
        "history",
    ),
]


@pytest.mark.parametrize(
    "factory,error,word", [c[1:] for c in CONSTRUCTOR], ids=[c[0] for c in CONSTRUCTOR]
)
def test_bad_constructor_arguments_are_rejected_naming_the_argument(factory, error, word):
    with pytest.raises(error) as err:
        factory()
    assert word in str(err.value)


def writer_setup():
    store = StepStore({"obs": ((2,), "float32"), "step": "int64"}, capacity=8)
    table = Table("seq", store=store, layout=ItemLayout.sequence(store.signature, 2), seed=0)
    writer = TrajectoryWriter(table)
    for k in range(3):
        writer.append({"obs": np.full(2, k, np.float32), "step": k})
    writer.create_item(table, priority=1.0)
    return store, table, writer


WRITER_CASES = [
    (
        "append unknown field",
        lambda w, t: w.append({"obs": np.zeros(2), "step": 1, "x": 1}),
        SignatureError,
        "x",
    ),
    (
        "append wrong shape",
        lambda w, t: w.append({"obs": np.zeros(3), "step": 1}),
        SignatureError,
        "obs",
    ),
    (
        "append batch wrong dtype",
        lambda w, t: w.append_batch({"obs": np.zeros((2, 2)), "step": np.zeros(2)}),
        SignatureError,
        "step",
    ),
    (
        "append a float beyond float32",
        lambda w, t: w.append({"obs": np.array([1e40, 0.0]), "step": 1}),
        SignatureError,
        "inf",
    ),
    (
        "item priority NaN",
        lambda w, t: w.create_item(t, priority=float("nan")),
        InvalidArgumentError,
        "priorit",
    ),
    (
        "item priority negative",
        lambda w, t: w.create_item(t, priority=-1.0),
        InvalidArgumentError,
        "priorit",
    ),
    ("item start positive", lambda w, t: w.create_item(t, start=1), InvalidArgumentError, "start"),
    (
        "item start before the episode",
        lambda w, t: w.create_item(t, start=-4),
        InvalidArgumentError,
        "start",
    ),
    (
        "item in an unknown table",
        lambda w, t: w.create_item("other"),
        InvalidArgumentError,
        "other",
    ),
    (
        "item timeout zero",
        lambda w, t: w.create_item(t, start=-2, timeout=0),
        InvalidArgumentError,
        "timeout",
    ),
]


@pytest.mark.parametrize(
    "call,error,word", [c[1:] for c in WRITER_CASES], ids=[c[0] for c in WRITER_CASES]
)
def test_bad_writer_input_is_rejected_and_changes_nothing(call, error, word):
    _, table, writer = writer_setup()
    before = snapshot(table)
    ids_before = writer.episode_step_ids
    with pytest.raises(error) as err:
        call(writer, table)
    assert word in str(err.value)
    assert_same(before, snapshot(table))
    assert writer.episode_step_ids == ids_before


def test_uniform_sampler_rejects_nothing_it_is_given_by_the_table():
    # A control for the cases above: the same calls with good input succeed.
    table = Table("t", signature=ROW_SIGNATURE, max_size=MAX_SIZE, sampler=Uniform(), seed=0)
    keys = table.insert(rows(0, 2), priorities=[1.0, 0.0], timeout=1.0)
    assert table.update_priorities(keys, [0.5, 2.0]) == 2
    assert len(table.sample(MAX_SIZE, timeout=1.0)) == MAX_SIZE
    assert table.delete(keys) == 2


def test_creating_more_items_than_max_size_at_once_is_rejected():
    store = StepStore(ROW_SIGNATURE, capacity=16)
    table = Table("t", store=store, max_size=3)
    store.append(rows(0, 6))
    before = snapshot(table)
    with pytest.raises(InvalidArgumentError, match="max_size"):
        table.create_items(np.arange(6))
    assert_same(before, snapshot(table))
    assert len(table.create_items(np.arange(3))) == 3 and table.size == 3


def test_row_insert_into_a_table_of_multi_step_items_is_rejected():
    store = StepStore(ROW_SIGNATURE, capacity=16)
    table = Table("t", store=store, layout=ItemLayout.sequence(store.signature, 2))
    with pytest.raises(InvalidArgumentError, match="TrajectoryWriter"):
        table.insert(rows(0, 2))
    assert store.next_id == 0 and table.size == 0


CLOSED_CALLS = {
    "insert": lambda t, k: t.insert(rows(10, 1), timeout=1.0),
    "sample": lambda t, k: t.sample(1, timeout=1.0),
    "update_priorities": lambda t, k: t.update_priorities(k[:2], [1.0, 2.0]),
    "delete": lambda t, k: t.delete(k[:2]),
}


@pytest.mark.parametrize("call", sorted(CLOSED_CALLS))
def test_calls_on_a_closed_table_raise_closed_error(call):
    from rlreplay import ClosedError

    table, keys = filled_table()
    table.close()
    before = snapshot(table)
    with pytest.raises(ClosedError, match="closed"):
        CLOSED_CALLS[call](table, keys)
    assert_same(before, snapshot(table))


def full_queue():
    """A queue of one item, full (its limiter blocks every insert), and its writer with
    two steps retained."""
    queue = Table.queue("q", 1, signature={"x": "float32"})
    writer = TrajectoryWriter(queue, history=2)
    writer.append({"x": 0.0})
    writer.append({"x": 1.0})
    writer.create_item(queue)
    return queue, writer


# Each call would wait for the full queue's limiter if its arguments were good: bad ones
# are refused at once, naming what is wrong, whatever the timeout.
BEFORE_WAITING = [
    (
        "writer item priority NaN",
        lambda w, q, s: w.create_item(q, timeout=s, priority=float("nan")),
        "priorit",
    ),
    (
        "writer item priority text",
        lambda w, q, s: w.create_item(q, timeout=s, priority="high"),
        "priorit",
    ),
    (
        "writer item before the episode",
        lambda w, q, s: w.create_item(q, timeout=s, start=-3),
        "start",
    ),
    (
        "writer items float starts",
        lambda w, q, s: w.create_items(q, timeout=s, starts=[-1.7]),
        "starts",
    ),
    (
        "writer items text starts",
        lambda w, q, s: w.create_items(q, timeout=s, starts=["a"]),
        "starts",
    ),
    (
        "writer items priorities of another length",
        lambda w, q, s: w.create_items(q, [1.0, 2.0], starts=[-1], timeout=s),
        "priorities",
    ),
    (
        "writer items before the episode",
        lambda w, q, s: w.create_items(q, timeout=s, starts=[-1, -3]),
        "starts",
    ),
    ("table item anchor not stored", lambda w, q, s: q.create_item(10**6, timeout=s), "anchor"),
    ("table item anchor held", lambda w, q, s: q.create_item(1, timeout=s), "already holds"),
    ("table item float anchor", lambda w, q, s: q.create_item(1.5, timeout=s), "anchor_id"),
    (
        "table items anchor not stored",
        lambda w, q, s: q.create_items([1, 10**6], timeout=s),
        "anchor",
    ),
    ("table items float anchors", lambda w, q, s: q.create_items([1.0], timeout=s), "anchor_ids"),
    (
        "writer item at an anchor the table holds",
        lambda w, q, s: w.create_item(q, start=-1, timeout=s),
        "already holds",
    ),
    (
        "writer items at an anchor the table holds",
        lambda w, q, s: w.create_items(q, starts=[-1], timeout=s),
        "already holds",
    ),
    ("table item bool anchor", lambda w, q, s: q.create_item(True, timeout=s), "anchor_id"),
]


@pytest.mark.parametrize(
    "call,word", [c[1:] for c in BEFORE_WAITING], ids=[c[0] for c in BEFORE_WAITING]
)
@pytest.mark.parametrize("timeout", [None, 5.0])
def test_bad_item_arguments_are_refused_before_waiting_for_the_limiter(call, word, timeout):
    queue, writer = full_queue()
    before = snapshot(queue)
    raised: list[BaseException] = []

    def run():
        try:
            call(writer, queue, timeout)
        except BaseException as error:  # reported below
            raised.append(error)

    caller = threading.Thread(target=run, daemon=True)
    caller.start()
    caller.join(2.0)  # (a call that waited would still be waiting)
    assert not caller.is_alive(), "the call waited for the limiter instead of refusing"
    assert len(raised) == 1 and isinstance(raised[0], InvalidArgumentError), raised
    assert word in str(raised[0])
    assert_same(before, snapshot(queue))
    queue.close()


@pytest.mark.parametrize(
    "value, said",
    [
        ([1, np.zeros(2, np.float32)], "is a list of 2 value(s)"),
        ((1,), "is a tuple of 1 value(s)"),
        ((1, np.zeros(2, np.float32), 3), "is a tuple of 3 value(s)"),
    ],
    ids=["list", "too_short", "too_long"],
)
def test_a_tuple_space_value_of_the_wrong_form_says_what_it_takes(value, said):
    from gymnasium.spaces import Box, Discrete
    from gymnasium.spaces import Tuple as TupleSpace

    from rlreplay import Signature

    sig = Signature.from_spaces(TupleSpace((Discrete(2), Box(-1, 1, (2,)))), Discrete(2))
    table = Table("t", signature=sig, max_size=4)
    with pytest.raises(SignatureError) as err:
        table.insert({"obs": value, "action": 0, "reward": 0.0})
    assert said in str(err.value) and "takes a tuple of 2 values" in str(err.value)
    assert table.size == 0
    table.insert({"obs": (1, np.zeros(2, np.float32)), "action": 0, "reward": 0.0})
    assert table.size == 1


BOOLS_FOR_NUMBERS = [
    ("n_step", lambda: ItemLayout.transition(ROW_SIGNATURE, n_step=True), "n_step=True"),
    ("length", lambda: ItemLayout.sequence(ROW_SIGNATURE, True), "length=True"),
    ("queue size", lambda: rr.Queue(True), "size=True"),
    ("min size", lambda: rr.MinSize(True), "min_size_to_sample=True"),
    (
        "sample timeout",
        lambda: make(max_size=4, capacity=4).sample(1, timeout=True),
        "timeout=True",
    ),
    (
        "warn_after",
        lambda: Table("t", signature=ROW_SIGNATURE, max_size=4, warn_after=True),
        "warn_after=True",
    ),
    (
        "n-step n",
        lambda: rr.NStepTransitionAdder(make(max_size=4, capacity=4), n=True, discount=0.9),
        "n=True",
    ),
    (
        "max_times_sampled",
        lambda: Table("t", signature=ROW_SIGNATURE, max_size=4, max_times_sampled=True),
        "max_times_sampled=True",
    ),
    ("table seed", lambda: Table("t", signature=ROW_SIGNATURE, max_size=4, seed=True), "seed=True"),
    (
        "iterator max_batches",
        lambda: rr.ReplayIterator(make(max_size=4, capacity=4), 1, max_batches=True),
        "max_batches=True",
    ),
]


@pytest.mark.parametrize(
    "build,word", [c[1:] for c in BOOLS_FOR_NUMBERS], ids=[c[0] for c in BOOLS_FOR_NUMBERS]
)
def test_a_bool_given_for_a_count_or_seconds_is_refused_naming_it(build, word):
    # True is an int to Python; as a count or a timeout it is a mistake
    with pytest.raises(InvalidArgumentError) as caught:
        build()
    assert word in str(caught.value)
