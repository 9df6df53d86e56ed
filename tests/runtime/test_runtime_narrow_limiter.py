"""The inline runtime over a table whose rate limiter admits only a few items at once:
the adder of 16 environments hands its items over in packs the limiter admits, so acting
and learning alternate and the run completes (a chunk of more items than the limiter
ever admits at once failed the actor with DeadlockError)."""

from __future__ import annotations

import pytest

pytest.importorskip("gymnasium")

import parts

import rlreplay.runtime as rt


@pytest.mark.parametrize("batch_size", [1, 4])
def test_inline_run_over_a_narrow_ratio_limiter_completes(batch_size):
    config = rt.RuntimeConfig(
        backend="inline",
        samples_per_insert=1.0,
        min_size_to_sample=10,
        error_buffer=5.0,  # at most 6 (filling) or 10 items admitted at once
        batch_size=batch_size,
        weight_sync_period=50,
        stats_every_s=3600.0,
        progress=False,
        timeout_s=20.0,
    )
    learner = parts.CountingLearner()
    result = rt.run(
        config,
        make_env=parts.make_env16,
        make_policy=parts.RandomPolicy,
        learner=learner,
        replay=parts.replay(max_size=20_000),
        total_env_steps=1_600,
    )
    s = result.summary
    assert s["env_steps"] == 1_600
    assert s["items_inserted"] >= 1_500  # all but the items of the last few open rows
    # the ratio held: every item sampled once, up to what the error buffer holds back
    assert s["items_inserted"] - 15 <= s["items_sampled"] <= s["items_inserted"]
    assert learner.updates * batch_size == s["items_sampled"]
