"""A tensor numpy cannot read (one that requires grad, or one on a GPU) is refused with a
typed error that says what to pass, wherever data, keys or priorities are taken, and
nothing stored changes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import rows
from test_bad_input import assert_same, filled_table, snapshot

from rlreplay import InvalidArgumentError, NStepTransitionAdder, Table, TrajectoryWriter
from rlreplay.core.value_casting import as_array

torch = pytest.importorskip("torch")


def grad(*shape: int) -> object:
    return torch.ones(*shape, requires_grad=True)


# name -> (call on a filled table and its keys, the argument the message names)
CALLS = {
    "insert_data": (lambda t, k: t.insert({"step": np.arange(2), "obs": grad(2, 3)}), "obs"),
    "insert_one_row": (lambda t, k: t.insert({"step": 1, "obs": grad(3)[0:3]}), "obs"),
    "insert_a_computed_row": (lambda t, k: t.insert({"step": 1, "obs": grad(3) * 2}), "obs"),
    "insert_priorities": (
        lambda t, k: t.insert(rows(10, 2), priorities=grad(2)),
        "priorities",
    ),
    "update_priorities": (lambda t, k: t.update_priorities(k[:2], grad(2)), "priorities"),
    "delete_keys": (
        lambda t, k: t.delete(torch.tensor(k[:2], dtype=torch.float64, requires_grad=True)),
        "keys",
    ),
    "writer_append": (
        lambda t, k: TrajectoryWriter(t).append({"step": 1, "obs": grad(3)}),
        "obs",
    ),
}


@pytest.mark.parametrize("case", CALLS)
def test_a_tensor_that_requires_grad_is_refused_saying_to_detach_it(case):
    call, argument = CALLS[case]
    table, keys = filled_table()
    before = snapshot(table)
    with pytest.raises(InvalidArgumentError) as caught:
        call(table, keys)
    message = str(caught.value)
    assert "requires grad" in message and "tensor.detach()" in message, message
    assert argument in message, message
    assert_same(before, snapshot(table))


def test_an_adders_step_of_tensors_that_require_grad_is_refused_saying_to_detach_it():
    sig = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")
    table = Table("n", signature=sig, capacity=64, layout=NStepTransitionAdder.layout(sig, 1))
    adder = NStepTransitionAdder(table, n=1, discount=0.9, num_envs=2)
    adder.reset(np.zeros((2, 3), np.float32))
    with pytest.raises(InvalidArgumentError, match=r"next_obs.*tensor\.detach\(\)"):
        adder.add(
            np.zeros(2, np.int64), np.ones(2), grad(2, 3), np.zeros(2, bool), np.zeros(2, bool)
        )
    assert table.store.next_id == 0


class DeviceTensor:
    """What numpy sees of a tensor in GPU memory: a device, and no array."""

    class device:
        type = "cuda"

    requires_grad = False
    shape, dtype = (2,), "float32"

    def __array__(self, dtype=None, copy=None):
        raise TypeError("can't convert cuda:0 device type tensor to numpy")


def test_a_tensor_on_a_gpu_is_refused_saying_to_move_it_to_the_cpu():
    with pytest.raises(InvalidArgumentError, match=r"priorities=.*on cuda.*tensor\.cpu\(\)"):
        as_array(DeviceTensor(), "priorities")


def test_a_cpu_tensor_without_grad_is_taken_as_it_is():
    table, _ = filled_table()
    keys = table.insert({"step": torch.arange(2), "obs": torch.ones(2, 3)}, torch.ones(2))
    assert len(keys) == 2
