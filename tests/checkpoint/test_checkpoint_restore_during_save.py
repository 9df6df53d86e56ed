"""A restore into tables whose checkpoint is still streaming their columns: the
checkpoint keeps the columns as they were at its moment, not the restored ones."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import Fifo, Table, Uniform, checkpoint
from rlreplay.checkpoint.save import StepwiseSave

SIG = {"obs": ((4,), "float32")}


def table_of(value: float, n: int) -> Table:
    table = Table(
        "t", signature=SIG, capacity=64, max_size=64, sampler=Uniform(), remover=Fifo(), seed=0
    )
    table.insert({"obs": np.full((n, 4), value, np.float32)})
    return table


@pytest.mark.parametrize("mmap", [False, True])
def test_a_restore_into_the_tables_while_their_checkpoint_streams_leaves_its_moment(tmp_path, mmap):
    other = table_of(7.0, 64)
    checkpoint.save(other, tmp_path / "other")
    table = table_of(1.0, 32)
    moment = {p: c.copy() for p, c in table.store.columns.items()}
    save = StepwiseSave(table, tmp_path / "main")
    while not save.done:
        save.step()
    checkpoint.restore(tmp_path / "other", table, mmap=mmap)  # the columns are replaced
    assert (table.store.columns["obs"] == 7.0).all()
    saved = checkpoint.restore(save.write())["t"]
    assert saved.size == 32
    for path, column in moment.items():
        np.testing.assert_array_equal(saved.store.columns[path], column)
