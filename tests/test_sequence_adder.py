"""Sequences and episodes never cross an episode boundary and hold the logged steps."""

from __future__ import annotations

import numpy as np
import pytest
from counting_env import episodes, make_vec
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay import EpisodeAdder, Fifo, InvalidArgumentError, SequenceAdder, Table

SIG = SequenceAdder.signature(obs=((3,), "float32"), action="int64")


def fill(adder, envs, obs, steps, seed):
    adder.reset(obs)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        action = rng.integers(5, size=envs.num_envs)
        obs, reward, term, trunc, info = envs.step(action)
        adder.add(action, reward, obs, term, trunc, info)
    adder.end_episode(terminated=False)
    return episodes(envs)


def check_sequences(data: dict, logs: dict, size: int, pad_end: bool) -> list[tuple]:
    """Every row of every sequence is the logged step of one episode, in order."""
    starts = []
    mask = data["mask"] if pad_end else np.ones(data["obs"].shape[:2], dtype=bool)
    for k in range(len(data["obs"])):
        real = int(mask[k].sum())
        assert real >= 1 and mask[k, :real].all() and not mask[k, real:].any()
        tag, epi, t0 = (int(v) for v in data["obs"][k, 0])
        ep = logs[(tag, epi)]
        total = len(ep["rewards"])
        assert t0 + real <= total + 1, "a sequence runs past its episode's final row"
        if not pad_end:
            assert real == size
        for j in range(real):
            t = t0 + j
            np.testing.assert_array_equal(data["obs"][k, j], ep["obs"][t])
            if t < total:
                assert data["action"][k, j] == ep["actions"][t]
                np.testing.assert_allclose(data["reward"][k, j], ep["rewards"][t], atol=1e-6)
                terminal_step = ep["terminated"] and t == total - 1
                assert data["discount"][k, j] == (0.0 if terminal_step else 1.0)
            else:
                assert data["action"][k, j] == 0 and data["discount"][k, j] == 0.0
        for field in ("obs", "action", "reward"):
            assert not np.any(data[field][k, real:]), "padding must be zeros"
        starts.append((tag, epi, t0))
    return starts


@settings(max_examples=100, deadline=None)
@given(
    num_envs=st.integers(1, 3),
    mode=st.sampled_from(["next_step", "same_step"]),
    seed=st.integers(0, 10_000),
    length=st.integers(1, 6),
    period=st.integers(1, 6),
    burn_in=st.integers(0, 2),
    pad_end=st.booleans(),
    capacity=st.integers(24, 60),
)
def test_sequences_never_cross_episodes_in_a_wrapping_ring(
    num_envs, mode, seed, length, period, burn_in, pad_end, capacity
):
    envs, obs = make_vec(num_envs, mode, seed)
    table = Table(
        "seq",
        signature=SIG,
        capacity=capacity,
        layout=SequenceAdder.layout(SIG, length, burn_in, pad_end),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = SequenceAdder(
        table,
        length,
        period,
        burn_in=burn_in,
        pad_end=pad_end,
        num_envs=num_envs,
        autoreset_mode=mode,
        chunk_length=2,
    )
    logs = fill(adder, envs, obs, 60, seed)
    if table.size:
        data = table.sample(table.size).data
        starts = check_sequences(data, logs, burn_in + length, pad_end)
        assert all(t0 % period == 0 for _, _, t0 in starts)


def test_sequences_of_a_large_store_cover_every_window_start():
    envs, obs = make_vec(2, "next_step", seed=3)
    table = Table(
        "seq",
        signature=SIG,
        capacity=4096,
        layout=SequenceAdder.layout(SIG, 3, 0, True),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = SequenceAdder(table, 3, 2, num_envs=2, chunk_length=4)
    logs = fill(adder, envs, obs, 50, seed=3)
    size = table.size
    starts = sorted(check_sequences(table.sample(size).data, logs, 3, True))
    expected = sorted(
        (tag, epi, s) for (tag, epi), ep in logs.items() for s in range(0, len(ep["rewards"]), 2)
    )
    assert starts == expected


def test_episode_adder_returns_whole_padded_episodes_with_mask():
    envs, obs = make_vec(3, "same_step", seed=5, max_len=8)
    table = Table(
        "ep",
        signature=SIG,
        capacity=2048,
        layout=EpisodeAdder.layout(SIG, 12),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = EpisodeAdder(table, 12, num_envs=3, autoreset_mode="same_step")
    logs = fill(adder, envs, obs, 40, seed=5)
    size = table.size
    data = table.sample(size).data
    check_sequences(data, logs, 12, True)
    assert sorted(data["mask"].sum(1).tolist()) == sorted(
        len(ep["rewards"]) + 1 for ep in logs.values() if ep["rewards"]
    )
    assert (data["obs"][:, 0, 2] == 0).all(), "every item starts at its episode's first step"


@pytest.mark.parametrize(
    ("length", "period", "burn_in", "discount"),
    [
        pytest.param(0, 1, 0, 1.0, id="length_zero"),
        pytest.param(2, 0, 0, 1.0, id="period_zero"),
        pytest.param(2, 1, -1, 1.0, id="negative_burn_in"),
        pytest.param(2, 1, 0, 1.5, id="discount_above_one"),
        pytest.param(2, 1, 0, "0.9", id="discount_a_string"),
    ],
)
def test_bad_sequence_arguments_raise(length, period, burn_in, discount):
    table = Table("s", signature=SIG, capacity=256, layout=SequenceAdder.layout(SIG, 2))
    with pytest.raises(InvalidArgumentError):
        SequenceAdder(table, length, period, burn_in=burn_in, discount=discount)


@pytest.mark.parametrize(
    ("max_length", "steps", "terminated"),
    [
        pytest.param(3, 3, True, id="steps_equal_max_length"),
        pytest.param(3, 6, False, id="steps_twice_max_length_truncated"),
        pytest.param(3, 2, True, id="rows_equal_max_length"),
        pytest.param(3, 4, True, id="steps_one_past_max_length"),
        pytest.param(1, 3, True, id="max_length_one"),
        pytest.param(4, 1, False, id="one_step"),
    ],
)
def test_episode_items_hold_every_row_once_final_observation_included(
    max_length, steps, terminated
):
    table = Table(
        "ep",
        signature=SIG,
        capacity=256,
        layout=EpisodeAdder.layout(SIG, max_length),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = EpisodeAdder(table, max_length, num_envs=None)
    adder.reset(np.zeros(3, np.float32))
    for t in range(1, steps + 1):
        end = t == steps
        adder.add(t, 1.0, np.full(3, t, np.float32), end and terminated, end and not terminated)
    data = table.sample(table.size).data
    rows = data["obs"][data["mask"]][:, 0]  # items in order, real rows only
    np.testing.assert_array_equal(rows, np.arange(steps + 1))
    assert data["mask"][:, 0].all(), "no item is empty"
    np.testing.assert_array_equal(data["action"][data["mask"]], [*range(1, steps + 1), 0])
    assert data["discount"][data["mask"]][-2] == (0.0 if terminated else 1.0)


@settings(max_examples=40, deadline=None)
@given(
    num_envs=st.integers(1, 3),
    mode=st.sampled_from(["next_step", "same_step"]),
    seed=st.integers(0, 10_000),
    max_length=st.integers(1, 5),
)
def test_episode_items_partition_each_episode_into_its_rows(num_envs, mode, seed, max_length):
    envs, obs = make_vec(num_envs, mode, seed, max_len=9)
    table = Table(
        "ep",
        signature=SIG,
        capacity=4096,
        layout=EpisodeAdder.layout(SIG, max_length),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = EpisodeAdder(table, max_length, num_envs=num_envs, autoreset_mode=mode)
    logs = fill(adder, envs, obs, 30, seed)
    data = table.sample(table.size).data
    check_sequences(data, logs, max_length, True)
    seen: dict[tuple[int, int], list[int]] = {}
    for k in range(len(data["obs"])):
        real = data["obs"][k][data["mask"][k]]
        seen.setdefault((int(real[0, 0]), int(real[0, 1])), []).extend(real[:, 2].astype(int))
    played = {key: ep for key, ep in logs.items() if ep["rewards"]}
    expected = {key: list(range(len(ep["rewards"]) + 1)) for key, ep in played.items()}
    assert {key: sorted(rows) for key, rows in seen.items()} == expected
