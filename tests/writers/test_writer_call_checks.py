"""A local TrajectoryWriter checks its timeouts as every other blocking call does, and
refuses every call after close."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import ClosedError, InvalidArgumentError, Table, TrajectoryWriter

SIG = {"x": "float32"}

CALLS = {
    "append": lambda w, t, timeout: w.append({"x": 1.0}, timeout=timeout),
    "append_batch": lambda w, t, timeout: w.append_batch({"x": np.ones(2)}, timeout=timeout),
    "create_item": lambda w, t, timeout: w.create_item(t, timeout=timeout),
    "create_items": lambda w, t, timeout: w.create_items(t, starts=[-1], timeout=timeout),
    "flush": lambda w, t, timeout: w.flush(timeout=timeout),
}


@pytest.mark.parametrize("timeout", [0, -1.0, "1", float("nan")], ids=["zero", "negative",
                                                                      "string", "nan"])
@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_a_timeout_that_is_not_seconds_above_zero_is_refused_and_nothing_changes(call, timeout):
    table = Table("t", signature=SIG, max_size=8)
    with TrajectoryWriter(table) as writer:
        writer.append({"x": 0.0})
        stored = table.store.next_id
        with pytest.raises(InvalidArgumentError, match="timeout="):
            call(writer, table, timeout)
        assert table.store.next_id == stored and table.size == 0


def test_end_episode_after_close_raises_closed_error():
    writer = TrajectoryWriter(Table("t", signature=SIG, max_size=8))
    writer.close()
    with pytest.raises(ClosedError):
        writer.end_episode()


def test_entering_a_closed_writer_raises_closed_error():
    writer = TrajectoryWriter(Table("t", signature=SIG, max_size=8))
    writer.close()
    with pytest.raises(ClosedError, match="closed"), writer:
        pass


@pytest.mark.parametrize("length", [4, 100])
def test_a_length_beyond_the_items_span_is_refused_naming_it(length):
    from rlreplay import NStepTransitionAdder

    sig = NStepTransitionAdder.signature(obs="float32", action="int64")
    layout = NStepTransitionAdder.layout(sig, n=2)  # items of 3 steps, shorter at episode ends
    table = Table("t", signature=sig, max_size=8, layout=layout)
    step = {"obs": 0.0, "action": 0, "reward": 0.0, "n_step_return": 0.0, "discount": 1.0}
    with TrajectoryWriter(table, history=5) as writer:
        for _ in range(5):
            writer.append(step)
        with pytest.raises(InvalidArgumentError, match=f"length={length} is more than the 3"):
            writer.create_item(table, length=length)
    assert table.size == 0
