"""examples/ppo_cartpole.py: GAE over rollouts with episode ends, a smoke run on every
backend (each rollout consumed exactly once) and a short run that fails when learning
breaks. The rollout adder's own tests are in tests/writers/test_rollout_adder.py."""

from __future__ import annotations

import importlib
import importlib.util
import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from rlreplay import InvalidArgumentError

# The examples install as rlreplay.examples, which actor processes import too.
ppo = importlib.import_module("rlreplay.examples.ppo_cartpole")

# ---------------------------------------------------------------------------------------
# GAE: hand-computed cases, gamma = lam = 0.5 (one stream, T = 3 steps, values has T + 1)

G = L = 0.5
F, T_ = False, True

# name: rewards, values (T + 1), terminated, truncated, valid, expected advantages
# fmt: off
GAE_CASES = {
    # deltas: 1 + .5*2 - 1 = 1, 1 + .5*3 - 2 = .5, 1 + .5*4 - 3 = 0
    # adv: a2 = 0, a1 = .5 + .25*0 = .5, a0 = 1 + .25*.5 = 1.125
    "no episode end: bootstrap from the last row": (
        [1, 1, 1], [1, 2, 3, 4], [F, F, F], [F, F, F], [T_, T_, T_], [1.125, 0.5, 0.0],
    ),
    # step 1 terminates: a1 = 1 - 2 = -1 (no bootstrap); row 2 is the autoreset step;
    # a0 = (1 + .5*2 - 1) + .25*(-1) = .75
    "termination mid-window": (
        [1, 1, 0], [1, 2, 9, 4], [F, T_, F], [F, F, F], [T_, T_, F], [0.75, -1.0, 0.0],
    ),
    # step 1 is truncated: a1 = 1 + .5*V(final obs = row 2 = 9) - 2 = 3.5, no recursion
    # from row 2 (the autoreset step); a0 = 1 + .25*3.5 = 1.875
    "truncation mid-window bootstraps from the final observation": (
        [1, 1, 0], [1, 2, 9, 4], [F, F, F], [F, T_, F], [T_, T_, F], [1.875, 3.5, 0.0],
    ),
    # the last step is truncated: a2 = 1 + .5*4 - 3 = 0; the window's bootstrap row holds
    # the final observation; a1 = 1 + .5*3 - 2 = .5; a0 = 1 + .5*2 - 1 + .25*.5 = 1.125
    "truncation at the last step": (
        [1, 1, 1], [1, 2, 3, 4], [F, F, F], [F, F, T_], [T_, T_, T_], [1.125, 0.5, 0.0],
    ),
    # step 0 terminates, rows 1 and 2 are padding with garbage values: nothing leaks
    # (a0 = 2 - 1; bootstrapping from the padding would give 2 + 25 - 1)
    "padding after a termination": (
        [2, 7, 7], [1, 50, 60, 70], [T_, F, F], [F, F, F], [T_, F, F], [1.0, 0.0, 0.0],
    ),
    # a step both terminated and truncated is a termination: no bootstrap
    "terminated and truncated together": (
        [1, 0, 0], [3, 9, 9, 9], [T_, F, F], [T_, F, F], [T_, F, F], [-2.0, 0.0, 0.0],
    ),
}
# fmt: on


DTYPES = (np.float32, np.float32, bool, bool, bool, np.float32)


@pytest.mark.parametrize("case", list(GAE_CASES))
def test_gae_respects_episode_ends_and_invalid_rows(case):
    values, expected = GAE_CASES[case][1], GAE_CASES[case][5]
    arrays = [np.asarray(x, dt)[:, None] for x, dt in zip(GAE_CASES[case], DTYPES)]
    adv, ret = ppo.gae(*arrays[:5], G, L)
    np.testing.assert_allclose(adv[:, 0], expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ret[:, 0], np.asarray(expected) + values[:3], atol=1e-6)


def test_gae_treats_streams_independently():
    columns = zip(*GAE_CASES.values())  # each input with one stream per case
    arrays = [np.asarray(c, dt).T for c, dt in zip(columns, DTYPES)]
    adv, _ = ppo.gae(*arrays[:5], G, L)
    np.testing.assert_allclose(adv, arrays[5], atol=1e-6)


# ---------------------------------------------------------------------------------------
# Runs


@pytest.mark.parametrize("backend", ["inline", "threads", "processes"])
def test_smoke_run_writes_outputs_and_consumes_every_rollout_once(tmp_path, backend):
    if backend == "processes":
        pytest.importorskip("zmq")
    out = tmp_path / backend
    flags = "--total-steps 1280 --num-envs 4 --num-steps 16 --num-actors 2 --eval-every 640"
    flags += " --eval-episodes 10 --no-progress --timeout-s 30"
    summary = ppo.main([*flags.split(), "--backend", backend, "--out", str(out)])
    rollouts = 1280 // (2 * 4 * 16) * 2
    assert summary["items_inserted"] == summary["items_sampled"] == rollouts
    assert summary["items_repeated"] == 0 and summary["updates"] == rollouts // 2
    assert summary["sample_age_mean"] == 0.0
    assert summary["final_eval_return"] is not None and summary["num_evals"] >= 1
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"eval_return", "approx_kl", "policy_lag_mean"} <= set(header)
    assert json.loads((out / "summary.json").read_text())["env_steps"] == 1280
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "learning_curve.png").stat().st_size > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_short_run_learns(seed):
    # A random policy scores about 20, and a run whose optimizer steps are disabled scores
    # 9 (seed 0) and 35 (seed 1); 20k env steps of learning pass 150 on both seeds.
    flags = "--backend inline --total-steps 20000 --eval-every 100000 --no-progress"
    summary = ppo.main([*flags.split(), "--seed", str(seed)])
    assert summary["final_eval_return"] >= 150, summary


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--eval-every", "0"], "--eval-every=0"),  # would never advance the next evaluation
        (["--num-steps", "-3"], "--num-steps=-3"),
        (["--gamma", "1.5"], "--gamma=1.5"),
    ],
)
def test_bad_flags_are_refused_before_the_run_starts(flags, named):
    with pytest.raises(InvalidArgumentError, match=named):
        ppo.main([*flags, "--no-progress"])
