"""A writer's batch of items that its table's rate limiter could never admit at once is
refused with DeadlockError at the call, not waited for without end (no sample could ever
make room for it), and the call changes nothing."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rlreplay import SampleToInsertRatio, Table, TrajectoryWriter
from rlreplay.errors import DeadlockError, RateLimiterTimeoutError


def limited_table(**kwargs) -> Table:
    # admits at most 15 inserts ahead of the samples (min_diff 5, max_diff 15)
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=10, error_buffer=5.0)
    return Table("t", signature={"x": "int64"}, max_size=100, rate_limiter=limiter, **kwargs)


def test_a_batch_of_items_the_limiter_can_never_admit_is_refused_not_awaited():
    table = limited_table()
    writer = TrajectoryWriter(table, history=32)
    writer.append_batch({"x": np.arange(20)})
    with pytest.raises(DeadlockError, match="18 items at once can never be admitted"):
        writer.create_items("t", starts=-np.arange(18, 0, -1), timeout=2.0)
    assert table.size == 0
    keys = writer.create_items("t", starts=-np.arange(15, 0, -1), timeout=2.0)
    assert len(keys) == 15 and table.size == 15


def test_the_warning_of_a_blocked_batch_gives_the_cause_for_the_whole_batch(caplog):
    """10 inserts ahead: one more item would be admitted, 8 would not. The warning must
    name the ratio (as the timeout does), not a queue holding rows."""
    table = limited_table(warn_after=0.1)
    writer = TrajectoryWriter(table, history=32)
    writer.append_batch({"x": np.arange(20)})
    writer.create_items("t", starts=-np.arange(10, 0, -1))
    writer.append_batch({"x": np.arange(20, 28)})  # steps no item is anchored on yet
    with (
        caplog.at_level(logging.WARNING, logger="rlreplay"),
        pytest.raises(RateLimiterTimeoutError, match="samples_per_insert=1 ratio"),
    ):
        writer.create_items("t", starts=-np.arange(8, 0, -1), timeout=0.5)
    warnings = [r.getMessage() for r in caplog.records if "blocked for over" in r.getMessage()]
    assert len(warnings) == 1 and "samples_per_insert=1 ratio" in warnings[0], warnings
    assert table.size == 10
