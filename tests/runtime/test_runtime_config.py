"""Bad configuration is refused before anything starts, naming the argument."""

from __future__ import annotations

import functools

import pytest

import rlreplay as rr
import rlreplay.runtime as rt
from rlreplay.errors import InvalidArgumentError

SIG = rr.NStepTransitionAdder.signature(
    obs=((4,), "float32"), action="int64", extras={"policy_version": "int64"}
)
ADDER = functools.partial(rr.NStepTransitionAdder, n=1, discount=0.9)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"backend": "dask"}, "backend='dask'"),
        ({"num_actors": 0}, "num_actors=0"),
        ({"batch_size": 2.5}, "batch_size=2.5"),
        ({"weight_sync_period": -1}, "weight_sync_period=-1"),
        ({"timeout_s": 0}, "timeout_s=0"),
        ({"samples_per_insert": -2.0}, "samples_per_insert=-2.0"),
        ({"samples_per_insert": 4.0, "updates_per_env_step": 1.0}, "give one of them"),
        ({"max_policy_lag": -1}, "max_policy_lag=-1"),
        ({"seed": True}, "seed=True"),
        ({"out_dir": 5}, "out_dir=5"),
        ({"out_dir": __file__}, "is a file, not a folder"),
    ],
    ids=["unknown-backend", "no-actors", "float-batch", "negative-period", "zero-timeout",
         "negative-ratio", "ratio-twice", "negative-lag", "bool-seed", "number-out-dir",
         "file-out-dir"],
)
def test_runtime_config_names_the_bad_argument(kwargs, names):
    with pytest.raises(InvalidArgumentError, match=names.replace("(", r"\(").replace(".", r"\.")):
        rt.RuntimeConfig(**kwargs)


def test_replay_spec_needs_a_policy_version_column():
    sig = rr.NStepTransitionAdder.signature(obs=((4,), "float32"), action="int64")
    with pytest.raises(InvalidArgumentError, match="policy_version"):
        rt.ReplaySpec(signature=sig, layout=None, adder=ADDER, max_size=10)


def test_replay_spec_refuses_an_adder_that_is_not_callable():
    with pytest.raises(InvalidArgumentError, match="adder="):
        rt.ReplaySpec(signature=SIG, layout=None, adder="nstep", max_size=10)


def test_off_policy_run_without_a_ratio_is_refused():
    spec = rt.ReplaySpec(signature=SIG, layout=rr.NStepTransitionAdder.layout(SIG, n=1),
                         adder=ADDER, max_size=100)
    with pytest.raises(InvalidArgumentError, match="updates_per_env_step"):
        rt.build_table(rt.RuntimeConfig(), spec)


def test_ratio_in_updates_per_env_step_is_samples_per_insert_over_the_batch():
    assert rt.RuntimeConfig(updates_per_env_step=0.5, batch_size=64).ratio == 32.0
    assert rt.RuntimeConfig(samples_per_insert=8.0).ratio == 8.0


def test_a_run_too_short_to_ever_sample_says_so(caplog):
    import parts

    config = rt.RuntimeConfig(
        backend="inline", updates_per_env_step=0.25, batch_size=16, min_size_to_sample=2000,
        progress=False,
    )
    with caplog.at_level("WARNING", logger="rlreplay"):
        result = rt.run(
            config, make_env=parts.make_env, make_policy=parts.RandomPolicy,
            learner=parts.CountingLearner(), replay=parts.replay(), total_env_steps=64,
        )
    said = [r.getMessage() for r in caplog.records if "below min_size_to_sample" in r.getMessage()]
    assert len(said) == 1 and "takes no step" in said[0]
    assert result.summary["updates"] == 0


@pytest.mark.parametrize("backend", ["inline", "threads"])
def test_a_batch_larger_than_the_table_is_refused_before_anything_starts(backend):
    import parts

    config = rt.RuntimeConfig(backend=backend, updates_per_env_step=0.25, batch_size=6000,
                              progress=False)
    learner = parts.CountingLearner()
    with pytest.raises(InvalidArgumentError, match="batch_size=6000 is more than the table holds"):
        rt.run(config, make_env=parts.make_env, make_policy=parts.RandomPolicy, learner=learner,
               replay=parts.replay(), total_env_steps=64)


@pytest.mark.parametrize(
    "params", [None, [1.0, 2.0], {"w": "abc"}, {"w": [["a", "b"]]}, {}],
    ids=["none", "list", "string", "strings", "empty"],
)
def test_the_weights_table_refuses_params_that_are_not_named_numeric_arrays(params):
    from rlreplay.runtime.weights import weights_table

    with pytest.raises(InvalidArgumentError, match="params"):
        weights_table(params)
