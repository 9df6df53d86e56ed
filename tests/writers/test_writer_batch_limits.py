"""A writer's batch of items that its table's rate limiter could never admit at once is
refused with DeadlockError at the call, not waited for without end (no sample could ever
make room for it), and the call changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import SampleToInsertRatio, Table, TrajectoryWriter
from rlreplay.errors import DeadlockError


def limited_table() -> Table:
    # admits at most 15 inserts ahead of the samples (min_diff 5, max_diff 15)
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=10, error_buffer=5.0)
    return Table("t", signature={"x": "int64"}, max_size=100, rate_limiter=limiter)


def test_a_batch_of_items_the_limiter_can_never_admit_is_refused_not_awaited():
    table = limited_table()
    writer = TrajectoryWriter(table, history=32)
    writer.append_batch({"x": np.arange(20)})
    with pytest.raises(DeadlockError, match="18 items at once can never be admitted"):
        writer.create_items("t", starts=-np.arange(18, 0, -1), timeout=2.0)
    assert table.size == 0
    keys = writer.create_items("t", starts=-np.arange(15, 0, -1), timeout=2.0)
    assert len(keys) == 15 and table.size == 15
