"""RolloutAdder: one stored row per vector step, one queue item per rollout of num_steps
steps plus the bootstrap row, over any observation, action and extras signature."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import (
    ClosedError,
    InvalidArgumentError,
    NStepTransitionAdder,
    ReplayTimeoutError,
    RolloutAdder,
    SignatureError,
    Table,
)

N, STEPS = 2, 3
F, T_ = False, True
EXTRAS = {"logp": "float32", "value": "float32"}


def queue(size: int = 4, steps: int = STEPS, **signature) -> Table:
    spec = {"obs": ((4,), "float32"), "action": "int64", "num_envs": N, "extras": EXTRAS}
    sig = RolloutAdder.signature(**{**spec, **signature})
    return Table.queue("q", size, signature=sig, layout=RolloutAdder.layout(sig, steps))


def step(adder, t: int, term=(False, False), trunc=(False, False), version: int = 7, **kw):
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
            **kw,
        },
    )


def start(table: Table, **kwargs) -> RolloutAdder:
    adder = RolloutAdder(table, num_steps=STEPS, num_envs=N, **kwargs)
    adder.reset(np.array([[0] * 4, [10] * 4], dtype=np.float32))
    return adder


def test_one_item_per_rollout_with_the_bootstrap_row_and_autoreset_steps():
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
    np.testing.assert_array_equal(data["logp"][0, :, 1], [0, -0.5, -1, 0])
    np.testing.assert_array_equal(data["policy_version"][0], [7, 7, 7, 7])
    step(adder, 3, version=8)
    step(adder, 4, version=8)
    step(adder, 5, version=8)
    data = table.sample(1, timeout=1).data
    np.testing.assert_array_equal(data["obs"][0, :, 0, 0], [3, 4, 5, 6])  # continues
    np.testing.assert_array_equal(data["autoreset"][0, 0], [F, T_])
    np.testing.assert_array_equal(data["policy_version"][0], [8, 8, 8, 8])


def test_image_dict_observations_continuous_actions_and_shaped_extras():
    obs_spec = {"image": ((3, 8, 8), "uint8"), "state": ((2,), "float64")}
    extras = {"mean": ((2,), "float32"), "value": "float32"}
    sig = RolloutAdder.signature(obs_spec, ((2,), "float32"), num_envs=N, extras=extras)
    assert sig["obs/image"].shape == (N, 3, 8, 8) and sig["action"].shape == (N, 2)
    assert sig["mean"].shape == (N, 2) and sig["policy_version"].shape == ()
    table = Table.queue("q", 2, signature=sig, layout=RolloutAdder.layout(sig, 2))
    adder = RolloutAdder(table, num_steps=2)  # num_envs from the signature
    assert adder.num_envs == N

    def obs(t):
        return {"image": np.full((N, 3, 8, 8), t, np.uint8), "state": np.full((N, 2), t / 2)}

    adder.reset(obs(0))
    for t in range(2):
        adder.add(
            np.full((N, 2), 0.25 * t, np.float32),
            np.ones(N),
            obs(t + 1),
            np.zeros(N, bool),
            np.zeros(N, bool),
            {},
            extras={"mean": np.full((N, 2), t), "value": np.ones(N), "policy_version": 3},
        )
    data = table.sample(1, timeout=1).data
    assert data["obs/image"].shape == (1, 3, N, 3, 8, 8) and data["obs/image"].dtype == np.uint8
    np.testing.assert_array_equal(data["obs/image"][0, :, 1, 0, 0, 0], [0, 1, 2])
    np.testing.assert_array_equal(data["obs/state"][0, :, 0, 0], [0, 0.5, 1])
    np.testing.assert_array_equal(data["action"][0, :, 0, 1], [0, 0.25, 0])
    np.testing.assert_array_equal(data["mean"][0, :, 1, 0], [0, 1, 0])
    np.testing.assert_array_equal(data["policy_version"][0], [3, 3, 3])


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"extras": {"terminated": "bool"}}, "terminated"),
        ({"extras": {"policy_version": "int64"}}, "policy_version"),
        ({"num_envs": 0}, "num_envs=0"),
        ({"obs": ("float32", (4,))}, "dtype first"),
    ],
)
def test_signature_refuses_reserved_names_and_bad_specs(kwargs, named):
    spec = {"obs": ((4,), "float32"), "action": "int64", "num_envs": N, **kwargs}
    with pytest.raises(InvalidArgumentError, match=named):
        RolloutAdder.signature(**spec)


@pytest.mark.parametrize("layout_steps", [STEPS - 1, None], ids=["shorter_rollouts", "rows"])
def test_a_table_whose_items_are_not_this_adders_rollouts_is_refused(layout_steps):
    table = queue(steps=STEPS)
    if layout_steps is None:  # items of one row each
        table = Table.queue("rows", 4, signature=table.store.signature)
    else:
        table = queue(steps=layout_steps)
    with pytest.raises(InvalidArgumentError, match=f"num_steps={STEPS} is {STEPS + 1}"):
        RolloutAdder(table, STEPS, num_envs=N)
    assert table.store.overwrite.retentions() == []  # no writer was set up


def test_layout_refuses_a_bad_num_steps():
    sig = RolloutAdder.signature(((4,), "float32"), "int64", num_envs=N)
    with pytest.raises(InvalidArgumentError, match="num_steps=0"):
        RolloutAdder.layout(sig, 0)


GOOD = {"logp": np.zeros(N), "value": np.zeros(N), "policy_version": 7}
ZERO_STEP = (np.zeros(N, np.int64), np.zeros(N), np.zeros((N, 4)), np.zeros(N, bool))

# name: (action, reward, next_obs, terminated, truncated, info, extras), error, match
# fmt: off
BAD_STEPS = {
    "missing extra": ((*ZERO_STEP, np.zeros(N, bool), {}, {"value": np.zeros(N),
                       "policy_version": 7}), SignatureError, "missing \\['logp'\\]"),
    "unknown extra": ((*ZERO_STEP, np.zeros(N, bool), {}, {**GOOD, "entropy": np.zeros(N)}),
                      SignatureError, "unknown \\['entropy'\\]"),
    "no policy version": ((*ZERO_STEP, np.zeros(N, bool), {}, {"logp": np.zeros(N),
                           "value": np.zeros(N)}), InvalidArgumentError, "policy_version"),
    "two policy versions": ((*ZERO_STEP, np.zeros(N, bool), {}, {**GOOD,
                             "policy_version": [1, 2]}), InvalidArgumentError, "one integer"),
    "reward of another env count": ((np.zeros(N, np.int64), np.zeros(N + 1), np.zeros((N, 4)),
                                     np.zeros(N, bool), np.zeros(N, bool), {}, GOOD),
                                    SignatureError, "reward"),
    "float action": ((np.full(N, 0.5), *ZERO_STEP[1:], np.zeros(N, bool), {}, GOOD),
                     SignatureError, "'action'.*float64"),
    "next_obs shape": ((*ZERO_STEP[:2], np.zeros((N, 5)), ZERO_STEP[3], np.zeros(N, bool), {},
                        GOOD), SignatureError, "next_obs"),
    "same-step info": ((*ZERO_STEP[:3], np.ones(N, bool), np.zeros(N, bool),
                        {"final_obs": np.zeros((N, 4))}, GOOD), InvalidArgumentError,
                       "SAME_STEP"),
}
# fmt: on


@pytest.mark.parametrize("case", list(BAD_STEPS))
def test_a_refused_step_records_nothing(case):
    args, error, match = BAD_STEPS[case]
    table = queue()
    adder = start(table)
    step(adder, 0)
    with pytest.raises(error, match=match):
        adder.add(*args[:6], extras=args[6])
    step(adder, 1)
    step(adder, 2)
    data = table.sample(1, timeout=1).data
    np.testing.assert_array_equal(data["obs"][0, :, 0, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(data["autoreset"][0], np.zeros((STEPS + 1, N), bool))


def test_add_before_reset_and_a_bad_reset_are_refused():
    adder = RolloutAdder(queue(), num_steps=STEPS)
    with pytest.raises(InvalidArgumentError, match="reset"):
        step(adder, 0)
    with pytest.raises(SignatureError, match="reset\\(\\) obs"):
        adder.reset(np.zeros((N + 1, 4), np.float32))


@pytest.mark.parametrize(
    "table, kwargs, named",
    [
        ("other env count", {"num_envs": N + 1}, "not per env"),
        ("n-step signature", {}, "policy_version"),
        ("cartpole", {"autoreset_mode": "same_step"}, "next-step autoreset only"),
        ("cartpole", {"num_steps": 0}, "num_steps=0"),
        ("cartpole", {"timeout": -1}, "timeout=-1"),
    ],
)
def test_construction_refuses_what_it_cannot_write(table, kwargs, named):
    if table == "n-step signature":
        sig = NStepTransitionAdder.signature(((4,), "float32"), "int64")
        target = Table("t", signature=sig, max_size=8, layout=NStepTransitionAdder.layout(sig, 1))
    else:
        target = queue()
    with pytest.raises(InvalidArgumentError, match=named):
        RolloutAdder(target, **{"num_steps": STEPS, **kwargs})


def test_reset_starts_a_new_rollout_and_drops_the_unfinished_steps():
    table = queue()
    adder = start(table)
    step(adder, 0)
    step(adder, 1, term=(True, True))
    adder.reset(np.array([[50] * 4, [60] * 4], dtype=np.float32))
    for t in range(STEPS):
        step(adder, t)
    assert table.size == 1 and adder.items_added == 1
    data = table.sample(1, timeout=1).data
    np.testing.assert_array_equal(data["obs"][0, :, 0, 0], [50, 1, 2, 3])
    assert not data["autoreset"].any()  # a reset is no autoreset step


def test_a_rollout_the_full_queue_refused_waits_for_flush():
    table = queue(size=1)
    adder = start(table, timeout=0.05)
    for t in range(2 * STEPS - 1):
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


def test_a_step_whose_earlier_rollout_the_queue_still_refuses_is_recorded():
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


def test_close_hands_finished_rollouts_over_and_drops_the_unfinished_one():
    table = queue()
    adder = start(table)
    for t in range(STEPS + 1):
        step(adder, t)
    adder.close()
    assert table.size == 1 and table.info().inserts == 1
    adder.flush()  # after close: nothing more to do


def test_rows_follow_a_gymnasium_vector_env_with_next_step_autoreset():
    gym = pytest.importorskip("gymnasium")
    envs = gym.make_vec("CartPole-v1", num_envs=N, vectorization_mode="sync")
    steps = 40
    sig = RolloutAdder.signature(((4,), "float32"), "int64", num_envs=N)
    table = Table.queue("q", 4, signature=sig, layout=RolloutAdder.layout(sig, steps))
    adder = RolloutAdder(table, num_steps=steps, num_envs=N)
    obs, _ = envs.reset(seed=3)
    adder.reset(obs)
    seen = {"obs": [obs], "reward": [], "ended": []}
    rng = np.random.default_rng(0)
    for _ in range(steps):
        action = rng.integers(0, 2, N)
        obs, reward, term, trunc, info = envs.step(action)
        adder.add(action, reward, obs, term, trunc, info, extras={"policy_version": 0})
        seen["obs"].append(obs)
        seen["reward"].append(reward)
        seen["ended"].append(term | trunc)
    envs.close()
    data = table.sample(1, timeout=1).data
    ended = np.array(seen["ended"])
    assert ended.any()  # random CartPole episodes end within 40 steps
    np.testing.assert_array_equal(data["obs"][0], np.array(seen["obs"], np.float32))
    np.testing.assert_array_equal(data["autoreset"][0, 1:steps], ended[:-1])
    # gymnasium's autoreset step gives reward 0; every other CartPole step gives 1
    np.testing.assert_array_equal(data["reward"][0, :steps], np.array(seen["reward"]))
    np.testing.assert_array_equal(data["reward"][0, 1:steps] == 0, ended[:-1])


def test_calls_after_close_are_refused():
    table = queue()
    adder = start(table)
    adder.close()
    with pytest.raises(ClosedError, match="add\\(\\) after close"):
        step(adder, 0)
    with pytest.raises(ClosedError, match="reset\\(\\) after close"):
        adder.reset(np.zeros((N, 4), np.float32))
