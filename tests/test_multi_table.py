"""Items in several tables over the same stored steps, and per-item extents in tables."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from counting_env import episodes, make_vec

from rlreplay import (
    Fifo,
    InvalidArgumentError,
    ItemLayout,
    NStepTransitionAdder,
    Prioritized,
    Table,
    Window,
)
from rlreplay.core.specs import Signature

SIG = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")


def make_table(name, store=None, **kw):
    layout = NStepTransitionAdder.layout(SIG, n=2)
    if store is None:
        return Table(name, signature=SIG, capacity=8192, layout=layout, **kw)
    return Table(name, store=store, layout=layout, **kw)


def test_a_second_table_over_a_store_costs_its_index_not_the_steps():
    sig = NStepTransitionAdder.signature(obs=((84, 84), "uint8"), action="int64")
    layout = NStepTransitionAdder.layout(sig, n=3, stack=4)
    first = Table("prio", signature=sig, capacity=4096, layout=layout, sampler=Prioritized())
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    second = Table("queue", store=first.store, layout=layout, sampler=Fifo())
    added = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert first.store.nbytes > 4096 * 84 * 84
    assert added <= 2 * second.index_nbytes() < first.store.nbytes / 50


def test_two_tables_share_one_store_and_both_sample_the_logged_transitions():
    prio = make_table("prio", sampler=Prioritized(0.6), seed=1)
    queue = make_table("queue", store=prio.store, sampler=Fifo(), max_times_sampled=1)
    envs, obs = make_vec(3, "next_step", seed=7)
    adder = NStepTransitionAdder([prio, queue], n=2, discount=0.5, num_envs=3, chunk_length=8)
    adder.reset(obs)
    rng = np.random.default_rng(7)
    for _ in range(100):
        action = rng.integers(5, size=3)
        obs, reward, term, trunc, info = envs.step(action)
        adder.add(action, reward, obs, term, trunc, info)
    adder.end_episode()
    logs = episodes(envs)
    steps = sum(len(ep["rewards"]) for ep in logs.values())
    assert prio.size == queue.size == steps
    # Each step stored once (plus one final row per episode and bounded context copies).
    assert prio.store.next_id == adder.appended_rows
    assert adder.appended_rows - adder.copied_rows == steps + len(logs)

    from test_nstep_adder import check_items

    assert check_items(queue.sample(queue.size).data, logs, 2, 0.5, 1) == steps
    assert check_items(prio.sample(256).data, logs, 2, 0.5, 1) == 256


LAYOUT_CASES = [
    pytest.param({"lengths": np.array([0])}, id="length_zero"),
    pytest.param({"lengths": np.array([9])}, id="length_over_span"),
    pytest.param({"lengths": np.array([1.5])}, id="float_length"),
]


@pytest.mark.parametrize("kwargs", LAYOUT_CASES)
def test_bad_item_lengths_are_rejected_and_change_nothing(kwargs):
    table = make_table("t")
    table.store.append({p: np.zeros((8, *s.shape), s.dtype) for p, s in SIG.fields.items()})
    with pytest.raises(InvalidArgumentError):
        table.create_items(np.array([0]), **kwargs)
    assert table.size == 0


def test_lengths_on_a_fixed_span_table_are_rejected():
    sig = Signature({"x": "float32"})
    table = Table("t", signature=sig, capacity=16, layout=ItemLayout.sequence(sig, 3))
    table.store.append({"x": np.arange(8, dtype=np.float32)})
    with pytest.raises(InvalidArgumentError, match="fixed-span"):
        table.create_items(np.array([0]), lengths=np.array([2]))


def test_padded_windows_zero_fill_and_mask_past_the_item_end():
    sig = Signature({"x": "float32"})
    layout = ItemLayout({"x": Window("x", 0, 4, pad=True)}, sig, mask_field="mask")
    table = Table(
        "t", signature=sig, capacity=16, layout=layout, sampler=Fifo(), max_times_sampled=1
    )
    table.store.append({"x": np.arange(1, 9, dtype=np.float32)})
    table.create_items(np.array([0, 5]), lengths=np.array([4, 2]))
    data = table.sample(2).data
    np.testing.assert_array_equal(data["x"], [[1, 2, 3, 4], [6, 7, 0, 0]])
    np.testing.assert_array_equal(data["mask"], [[1, 1, 1, 1], [1, 1, 0, 0]])
    assert ItemLayout.from_json(layout.to_json(), sig).windows == layout.windows


@pytest.mark.parametrize("stack", [1, 3])
def test_transition_table_and_sequence_queue_fill_from_one_stream(stack):
    from rlreplay import SequenceAdder, SequenceItems

    sig = SIG
    prio = Table(
        "prio",
        signature=sig,
        capacity=8192,
        sampler=Prioritized(0.6),
        layout=NStepTransitionAdder.layout(sig, n=2, stack=stack),
    )
    queue = Table.queue(
        "seq", 4096, store=prio.store, layout=SequenceAdder.layout(sig, 4, 0, pad_end=False)
    )
    envs, obs = make_vec(2, "same_step", seed=4)
    adder = NStepTransitionAdder(
        [prio, queue],
        n=2,
        discount=0.5,
        stack=stack,
        num_envs=2,
        autoreset_mode="same_step",
        chunk_length=6,
        sequence_tables={queue: SequenceItems(4, 2, pad_end=False)},
    )
    adder.reset(obs)
    rng = np.random.default_rng(4)
    for _ in range(80):
        action = rng.integers(5, size=2)
        obs, reward, term, trunc, info = envs.step(action)
        adder.add(action, reward, obs, term, trunc, info)
    adder.end_episode()
    logs = episodes(envs)
    steps = sum(len(ep["rewards"]) for ep in logs.values())
    assert prio.size == steps
    assert adder.appended_rows - adder.copied_rows == steps + stack * len(logs)
    from test_nstep_adder import check_items

    check_items(prio.sample(128).data, logs, 2, 0.5, stack)
    expected = sum(max(0, (len(ep["rewards"]) + 1 - 4) // 2 + 1) for ep in logs.values())
    assert queue.size == expected
    seqs = queue.sample(queue.size, timeout=1.0).data
    for k in range(len(seqs["obs"])):
        tag, epi, t0 = (int(v) for v in seqs["obs"][k, 0])
        ep = logs[(tag, epi)]
        assert t0 % 2 == 0 and t0 + 4 <= len(ep["rewards"]) + 1
        np.testing.assert_array_equal(seqs["obs"][k], ep["obs"][t0 : t0 + 4])
        acts = (ep["actions"] + [0])[t0 : t0 + 4]
        np.testing.assert_array_equal(seqs["action"][k], acts)
