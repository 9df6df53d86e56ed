"""examples/ppo_cartpole.py: GAE over rollouts with episode ends, the rollout adder (one
queue item per rollout), a smoke run on every backend (each rollout consumed exactly once)
and a short run that fails when learning breaks."""

from __future__ import annotations

import importlib
import importlib.util
import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from rlreplay import InvalidArgumentError, ReplayTimeoutError, Table

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
# The rollout adder

N, STEPS = 2, 3


def queue(size: int = 4) -> Table:
    sig = ppo.rollout_signature(N)
    return Table.queue("q", size, signature=sig, layout=ppo.rollout_layout(sig, STEPS))


def step(adder, t: int, term=(False, False), trunc=(False, False), version: int = 7):
    """Vector step ``t``: obs are ``t`` (env 0) and ``10 + t`` (env 1), rewards ``t``."""
    adder.add(
        np.array([t % 2, 1], dtype=np.int64),
        np.full(N, float(t)),
        np.array([[t + 1] * 4, [11 + t] * 4], dtype=np.float32),
        np.array(term),
        np.array(trunc),
        {},
        extras={
            "logp": np.full(N, -0.5 * t, np.float32),
            "value": np.full(N, 2.0 * t, np.float32),
            "policy_version": np.full(N, version, np.int64),
        },
    )


def start(table: Table, **kwargs):
    adder = ppo.RolloutAdder(table, num_envs=N, num_steps=STEPS, **kwargs)
    adder.reset(np.array([[0] * 4, [10] * 4], dtype=np.float32))
    return adder


def test_rollout_adder_writes_one_item_per_rollout_with_the_bootstrap_row():
    table = queue()
    adder = start(table)
    step(adder, 0)
    step(adder, 1, term=(True, False))
    assert table.size == 0  # not before the rollout is complete
    step(adder, 2, trunc=(False, True))
    assert table.size == 1 and adder.items_added == 1
    data = table.sample(1, timeout=1).data
    assert data["obs"].shape == (1, STEPS + 1, N, 4)
    np.testing.assert_array_equal(data["obs"][0, :, 0, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(data["obs"][0, :, 1, 0], [10, 11, 12, 13])
    np.testing.assert_array_equal(data["reward"][0, :, 0], [0, 1, 2, 0])
    np.testing.assert_array_equal(data["terminated"][0, :, 0], [F, T_, F, F])
    np.testing.assert_array_equal(data["truncated"][0, :, 1], [F, F, T_, F])
    # the step after an episode end is gymnasium's autoreset step, also across rollouts
    np.testing.assert_array_equal(data["autoreset"][0], [[F, F], [F, F], [T_, F], [F, F]])
    np.testing.assert_array_equal(data["value"][0, :, 0], [0, 2, 4, 0])
    np.testing.assert_array_equal(data["policy_version"][0], [7, 7, 7, 7])
    step(adder, 3, version=8)
    step(adder, 4, version=8)
    step(adder, 5, version=8)
    data = table.sample(1, timeout=1).data
    np.testing.assert_array_equal(data["obs"][0, :, 0, 0], [3, 4, 5, 6])  # continues
    np.testing.assert_array_equal(data["autoreset"][0, 0], [F, T_])
    np.testing.assert_array_equal(data["policy_version"][0], [8, 8, 8, 8])


def test_rollout_adder_refuses_bad_steps_without_recording_them():
    table = queue()
    adder = start(table)
    step(adder, 0)
    with pytest.raises(InvalidArgumentError, match="logp"):
        adder.add(
            np.zeros(N, np.int64),
            np.zeros(N),
            np.zeros((N, 4)),
            np.zeros(N, bool),
            np.zeros(N, bool),
            {},
            extras={"value": np.zeros(N), "policy_version": 7},
        )
    with pytest.raises(InvalidArgumentError, match="reward"):
        adder.add(
            np.zeros(N, np.int64),
            np.zeros(N + 1),
            np.zeros((N, 4)),
            np.zeros(N, bool),
            np.zeros(N, bool),
            {},
            extras={"logp": np.zeros(N), "value": np.zeros(N), "policy_version": 7},
        )
    with pytest.raises(InvalidArgumentError, match="action is float64"):
        adder.add(
            np.full(N, 0.5),
            np.zeros(N),
            np.zeros((N, 4)),
            np.zeros(N, bool),
            np.zeros(N, bool),
            {},
            extras={"logp": np.zeros(N), "value": np.zeros(N), "policy_version": 7},
        )
    step(adder, 1)
    step(adder, 2)
    data = table.sample(1, timeout=1).data
    np.testing.assert_array_equal(data["obs"][0, :, 0, 0], [0, 1, 2, 3])


def test_rollout_adder_refuses_a_signature_for_another_env_count():
    with pytest.raises(InvalidArgumentError, match="rollout_signature"):
        ppo.RolloutAdder(queue(), num_envs=N + 1, num_steps=STEPS)


def test_rollout_adder_keeps_a_rollout_the_full_queue_refused_until_flush():
    table = queue(size=1)
    adder = start(table, timeout=0.05)
    for t in range(STEPS):
        step(adder, t)
    for t in range(STEPS, 2 * STEPS - 1):
        step(adder, t)
    with pytest.raises(ReplayTimeoutError):
        step(adder, 2 * STEPS - 1)  # the queue is full: the second rollout waits
    with pytest.raises(ReplayTimeoutError):
        adder.flush(timeout=0.05)
    first = table.sample(1, timeout=1).data
    adder.flush(timeout=1)  # now the second rollout goes in, once
    second = table.sample(1, timeout=1).data
    assert table.size == 0 and table.info().inserts == 2 and adder.items_added == 2
    np.testing.assert_array_equal(first["obs"][0, :, 0, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(second["obs"][0, :, 0, 0], [3, 4, 5, 6])


def test_rollout_adder_records_a_step_whose_earlier_rollout_the_queue_still_refuses():
    table = queue(size=1)
    adder = start(table, timeout=0.05)
    for t in range(2 * STEPS - 1):
        step(adder, t)
    with pytest.raises(ReplayTimeoutError):
        step(adder, 2 * STEPS - 1)  # the second rollout waits
    with pytest.raises(ReplayTimeoutError):
        step(adder, 2 * STEPS)  # still waits; this step is recorded all the same
    table.sample(1, timeout=1)
    step(adder, 2 * STEPS + 1)  # hands the second rollout over first
    np.testing.assert_array_equal(table.sample(1, timeout=1).data["obs"][0, :, 0, 0], [3, 4, 5, 6])
    step(adder, 2 * STEPS + 2)
    third = table.sample(1, timeout=1).data
    np.testing.assert_array_equal(third["obs"][0, :, 0, 0], [6, 7, 8, 9])
    assert table.info().inserts == 3 == adder.items_added


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
    assert summary["policy_lag_mean"] == 0.0
    assert summary["final_eval_return"] is not None and summary["num_evals"] >= 1
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"eval_return", "approx_kl", "policy_lag_mean"} <= set(header)
    assert json.loads((out / "summary.json").read_text())["env_steps"] == 1280
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "learning_curve.png").stat().st_size > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_short_run_learns(seed):
    # 20k env steps reach 500 (seed 0) and 474 (seed 1); a random policy scores about 20,
    # and a run that does not learn (learning rate 1e-9) scores 9.
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
