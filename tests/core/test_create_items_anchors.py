"""``Table.create_items`` holds at most one item per anchor step, however the anchors are
ordered: increasing anchors are checked in one pass, any others are counted."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import Signature, Table
from rlreplay.errors import InvalidArgumentError


def filled_table(steps: int = 12) -> Table:
    table = Table("t", signature=Signature({"x": "float32"}), max_size=8, capacity=8)
    for first in range(0, steps, 4):  # the store keeps steps 4 .. 11
        table.store.append({"x": np.arange(first, first + 4, dtype=np.float32)})
    return table


@pytest.mark.parametrize(
    "anchors, ok",
    [
        pytest.param([4, 5, 7], True, id="increasing"),
        pytest.param([7, 4, 6], True, id="unordered_distinct"),
        pytest.param([5, 5], False, id="repeated"),
        pytest.param([4, 6, 4], False, id="repeated_unordered"),
        pytest.param([4, 6, 6, 7], False, id="repeated_within_increasing"),
    ],
)
def test_create_items_refuses_two_items_on_one_anchor_and_changes_nothing(anchors, ok):
    table = filled_table()
    if ok:
        keys = table.create_items(np.array(anchors))
        assert len(keys) == len(anchors) and table.size == len(anchors)
        return
    with pytest.raises(InvalidArgumentError, match="at most one item per anchor"):
        table.create_items(np.array(anchors))
    assert table.size == 0 and table.info().inserts == 0
