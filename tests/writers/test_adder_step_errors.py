"""add() with extras names the bad field the same way whichever form the extras come in.

A plain dict of arrays is checked as one flat dict; any other mapping (or values that are
not arrays) takes the nested form. Both must refuse a call with the same message and leave
the adder unchanged.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import rlreplay as rr
from rlreplay.errors import SignatureError

NUM_ENVS = 3
SIG = rr.NStepTransitionAdder.signature(
    obs=((4,), "float32"), action="int64", extras={"v": "int64"}
)
NO = np.zeros(NUM_ENVS, dtype=bool)


def _adder() -> rr.NStepTransitionAdder:
    table = rr.Table(
        "replay", signature=SIG, max_size=100, layout=rr.NStepTransitionAdder.layout(SIG, n=2)
    )
    adder = rr.NStepTransitionAdder(table, n=2, discount=0.9, num_envs=NUM_ENVS)
    adder.reset(np.zeros((NUM_ENVS, 4), np.float32))
    return adder


def _step(**overrides):
    step = {
        "action": np.zeros(NUM_ENVS, np.int64),
        "reward": np.zeros(NUM_ENVS, np.float32),
        "next_obs": np.zeros((NUM_ENVS, 4), np.float32),
        "extras": {"v": np.zeros(NUM_ENVS, np.int64)},
    }
    step.update(overrides)
    return step


CASES = {
    "short_extra": (
        {"extras": {"v": np.zeros(2, np.int64)}},
        "add()['extras/v'] has shape (2,); expected a leading axis of 3 environments",
    ),
    "short_action": (
        {"action": np.zeros(2, np.int64)},
        "add()['action'] has shape (2,); expected a leading axis of 3 environments",
    ),
    "dict_action": ({"action": {"a": np.zeros(3)}}, "missing ['action'], unknown ['action/a']"),
    "dict_extra": ({"extras": {"v": {"w": np.zeros(3)}}}, "unknown ['extras/v/w']"),
    "float_extra": (
        {"extras": {"v": np.full(3, 0.5)}},
        "add()['extras/v'] has dtype float64, which cannot be stored as int64",
    ),
    "missing_extra": ({"extras": {}}, "missing ['extras/v'], unknown []"),
    "unknown_extra": (
        {"extras": {"v": np.zeros(3, np.int64), "u": np.zeros(3)}},
        "missing [], unknown ['extras/u']",
    ),
}


@pytest.mark.parametrize("mapping", [dict, types.MappingProxyType], ids=["dict", "proxy"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_step_is_refused_naming_the_field_in_either_form(case, mapping):
    overrides, message = CASES[case]
    step = _step(**overrides)
    step["extras"] = mapping(step["extras"])
    adder = _adder()
    with pytest.raises(SignatureError) as err:
        adder.add(step["action"], step["reward"], step["next_obs"], NO, NO, extras=step["extras"])
    assert message in str(err.value)
    assert adder._steps.tolist() == [0] * NUM_ENVS  # the refused call changed nothing
    good = _step()
    adder.add(good["action"], good["reward"], good["next_obs"], NO, NO, extras=good["extras"])
    assert adder._steps.tolist() == [1] * NUM_ENVS
