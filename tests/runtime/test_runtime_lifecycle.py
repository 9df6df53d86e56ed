"""Run lifecycle: nothing left behind by a failed run, a failed start raises its own
error, prompt stops, long warm-ups, slow process exits, on-policy runs on processes."""

from __future__ import annotations

import functools
import threading
import time

import pytest

pytest.importorskip("gymnasium")

import parts

import rlreplay as rr
import rlreplay.runtime as rt
from rlreplay.errors import ComponentFailedError
from rlreplay.runtime.actor_groups import ThreadActors


def _run(backend, policy=parts.RandomPolicy, learner=None, total=20_000, replay=None, **kwargs):
    kwargs.setdefault("num_actors", 1)
    kwargs.setdefault("updates_per_env_step", 0.25)
    kwargs.setdefault("batch_size", 16)
    kwargs.setdefault("min_size_to_sample", 200)
    kwargs.setdefault("weight_sync_period", 50)
    kwargs.setdefault("timeout_s", 20.0)
    config = rt.RuntimeConfig(backend=backend, progress=False, **kwargs)
    return rt.run(
        config, make_env=parts.make_env, make_policy=policy,
        learner=learner or parts.CountingLearner(), replay=replay or parts.replay(),
        total_env_steps=total,
    )


def _on_policy(max_size: int) -> rt.ReplaySpec:
    return rt.ReplaySpec(
        signature=parts.SIGNATURE,
        layout=rr.NStepTransitionAdder.layout(parts.SIGNATURE, n=1),
        adder=functools.partial(rr.NStepTransitionAdder, n=1, discount=0.99),
        max_size=max_size, on_policy=True,
    )


def _priority_threads() -> int:
    return sum(t.name == "rlreplay-priorities" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("failing", ["actor", "learner"])
def test_a_failed_run_leaves_no_priority_thread(failing):
    before = _priority_threads()
    kwargs = ({"policy": parts.CrashingPolicy} if failing == "actor"
              else {"learner": parts.CountingLearner(fail_at=20)})
    with pytest.raises(ComponentFailedError):
        _run("threads", **kwargs)
    time.sleep(0.2)
    assert _priority_threads() == before


def test_a_start_that_fails_raises_its_own_error(monkeypatch):
    def refuse(self):
        raise OSError("can't start new thread")

    monkeypatch.setattr(ThreadActors, "start", refuse)
    with pytest.raises(OSError, match="can't start new thread"):
        _run("threads")


def test_max_policy_lag_other_than_none_or_zero_is_refused():
    with pytest.raises(rr.InvalidArgumentError, match="max_policy_lag=1"):
        rt.RuntimeConfig(max_policy_lag=1)


def test_on_policy_threads_run_keeps_sampled_steps_within_a_few_versions():
    learner = parts.CountingLearner()
    result = _run("threads", learner=learner, replay=_on_policy(2_000),
                  updates_per_env_step=None, batch_size=20, weight_sync_period=40,
                  max_policy_lag=0, total=3_000)
    # A period of 40 env steps yields about 40 one-step items, two batches: actors wait
    # for the weights those batches made, so sampled steps are a few versions old (without
    # the bound the queue lets the lag reach dozens of versions).
    assert result.summary["env_steps"] == 3_000
    lags = [r["sample_age_max"] for r in result.rows if r["sample_age_max"] >= 0]
    assert lags and max(lags) <= 10


def test_on_policy_run_whose_period_cannot_fill_a_batch_fails_as_a_deadlock():
    with pytest.raises(rr.DeadlockError, match="sync period"):
        _run("threads", replay=_on_policy(2_000), updates_per_env_step=None, batch_size=100,
             weight_sync_period=40, max_policy_lag=0, total=3_000)


def test_on_policy_processes_with_three_actors_completes():
    result = _run(
        "processes", replay=_on_policy(2_000), updates_per_env_step=None, batch_size=20,
        weight_sync_period=40, max_policy_lag=0, total=20_000, num_actors=3,
    )
    assert result.summary["env_steps"] >= 6_000


def test_processes_stop_promptly_when_actors_wait_for_weights():
    start = time.monotonic()
    with pytest.raises(ComponentFailedError, match="loss is nan"):
        _run(
            "processes", learner=parts.CountingLearner(fail_at=4, delay_s=0.5),
            replay=_on_policy(100_000), updates_per_env_step=None, batch_size=20,
            weight_sync_period=40, max_policy_lag=0, total=100_000, num_actors=3,
        )
    # start-up (spawn) and 3 updates of 0.5 s take under 6 s; the stop should be quick
    assert time.monotonic() - start < 10


def test_inline_make_env_failure_names_the_actor():
    def bad_env(seed):
        raise ValueError("no such env")

    config = rt.RuntimeConfig(backend="inline", updates_per_env_step=0.25, batch_size=16,
                              min_size_to_sample=200, progress=False)
    with pytest.raises(ComponentFailedError) as info:
        rt.run(config, make_env=bad_env, make_policy=parts.RandomPolicy,
               learner=parts.CountingLearner(), replay=parts.replay(), total_env_steps=100)
    assert info.value.component == "actor 0"


class _SlowPolicy(parts.RandomPolicy):
    """About 200 env steps/s: filling min_size_to_sample=1000 takes about 5 s."""

    def __call__(self, obs, env_steps):
        time.sleep(0.01)
        return super().__call__(obs, env_steps)


def test_a_warm_up_longer_than_timeout_s_is_not_a_learner_failure():
    # Healthy: the actor inserts all along; only the warm-up outlasts timeout_s.
    result = _run("threads", policy=_SlowPolicy, min_size_to_sample=1000, total=1600,
                  timeout_s=3.0)
    assert result.summary["updates"] > 0


class _LingeringPolicy(parts.RandomPolicy):
    """Starts a non-daemon thread (as a logger or an env server may), so its process
    exits only some seconds after the actor finished."""

    def __init__(self, index: int, num_actors: int, seed: int):
        super().__init__(index, num_actors, seed)
        threading.Thread(target=time.sleep, args=(20.0,), daemon=False).start()


def test_processes_run_ends_when_actors_finished_even_if_exit_is_slow():
    result = _run("processes", policy=_LingeringPolicy, total=2_000, timeout_s=3.0)
    assert result.summary["env_steps"] >= 2_000
