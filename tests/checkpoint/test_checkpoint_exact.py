"""After a restore, the same calls give the same results as without the save."""

from __future__ import annotations

import copy
import tempfile

import numpy as np
import pytest
from checkpoint_ops import CONFIGS, KINDS, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlreplay import checkpoint

OPS = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, 2), st.integers(1, 9)),
    min_size=1,
    max_size=30,
)


def continue_both(config: str, before: list, after: list, mmap: bool = False) -> None:
    """Run ``before``, save, then ``after`` on the table and on its restored copy."""
    tables = CONFIGS[config]()
    memory: dict = {}
    run(tables, before, memory)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.save(tables, tmp)
        restored = checkpoint.restore(tmp, mmap=mmap)
        assert sorted(restored) == sorted(tables)
        expected = run(tables, after, copy.deepcopy(memory))
        got = run(restored, after, copy.deepcopy(memory))
    assert got == expected


@pytest.mark.parametrize("config", sorted(CONFIGS))
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(before=OPS, after=OPS)
def test_restored_tables_answer_every_call_as_the_saved_ones(config, before, after):
    continue_both(config, before, after)


@pytest.mark.parametrize("config", ["prioritized", "shared_store", "stack"])
def test_a_memory_mapped_restore_answers_as_the_saved_tables(config):
    rng = np.random.default_rng(3)
    ops = [
        (str(rng.choice(KINDS)), int(rng.integers(3)), int(rng.integers(1, 9))) for _ in range(60)
    ]
    continue_both(config, ops[:30], ops[30:], mmap=True)
