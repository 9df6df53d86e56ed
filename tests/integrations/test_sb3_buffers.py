"""rlreplay's SB3 buffers against SB3's own on the same data, prioritized sampling,
pickling, memory and bad input (no training here: see test_sb3_algorithms.py)."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
import torch as th
from gymnasium import spaces
from scipy import stats
from stable_baselines3.common import buffers as sb3

from rlreplay.errors import EmptyTableError, InvalidArgumentError
from rlreplay.integrations.sb3 import (
    DictReplayBuffer,
    NStepReplayBuffer,
    PrioritizedDictReplayBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
)
from rlreplay.integrations.sb3 import steps as ring_steps

BOX = spaces.Box(-1.0, 1.0, (3,), np.float32)
DICT = spaces.Dict(
    {"pos": spaces.Box(-1, 1, (2,), np.float32), "img": spaces.Box(0, 255, (2, 2), np.uint8)}
)
DISCRETE = spaces.Discrete(3)
CONTINUOUS = spaces.Box(-1.0, 1.0, (2,), np.float32)


def random_obs(space, n, rng):
    if isinstance(space, spaces.Dict):
        return {key: random_obs(sub, n, rng) for key, sub in space.spaces.items()}
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (n, *space.shape)).astype(np.uint8)
    return rng.standard_normal((n, *space.shape)).astype(space.dtype)


def feed(buffers, steps, n_envs, obs_space, act_space, seed=0, continue_prob=0.8):
    """The same adds to every buffer: random transitions whose next obs is usually the
    following obs, with dones, timeouts and obs that do not continue (episode ends)."""
    rng = np.random.default_rng(seed)
    obs = random_obs(obs_space, n_envs, rng)
    for _ in range(steps):
        next_obs = random_obs(obs_space, n_envs, rng)
        if isinstance(act_space, spaces.Discrete):
            action = rng.integers(0, act_space.n, n_envs)
        else:
            action = rng.uniform(-1, 1, (n_envs, *act_space.shape)).astype(np.float32)
        reward = rng.standard_normal(n_envs).astype(np.float32)
        done = rng.random(n_envs) < 0.1
        infos = [{"TimeLimit.truncated": bool(t)} for t in rng.random(n_envs) < 0.5 * done]
        for buffer in buffers:
            buffer.add(obs, next_obs, action, reward, done, infos)
        # otherwise an episode ended in some env: the next obs is a reset one
        obs = next_obs if rng.random() < continue_prob else random_obs(obs_space, n_envs, rng)


def assert_samples_equal(a, b):
    assert type(a).__name__ == type(b).__name__ or b._fields[: len(a._fields)] == a._fields
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        if x is None:
            assert y is None, name
        elif isinstance(x, dict):
            assert x.keys() == y.keys()
            for key in x:
                assert x[key].dtype == y[key].dtype and th.equal(x[key], y[key]), (name, key)
        else:
            assert x.dtype == y.dtype, (name, x.dtype, y.dtype)
            assert th.equal(x, y), name


def assert_arrays_equal(ref, ours):
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
        x, y = getattr(ref, name), getattr(ours, name)
        if isinstance(x, dict):
            for key in x:
                np.testing.assert_array_equal(x[key], y[key], err_msg=f"{name}[{key}]")
        else:
            np.testing.assert_array_equal(x, y.astype(x.dtype), err_msg=name)
    assert (ref.pos, ref.full, ref.size()) == (ours.pos, ours.full, ours.size())


@pytest.mark.parametrize("n_envs", [1, 2])
@pytest.mark.parametrize("steps", [30, 75])  # under and over the buffer's size
@pytest.mark.parametrize("act_space", [DISCRETE, CONTINUOUS], ids=["discrete", "box"])
def test_same_data_and_samples_as_sb3(n_envs, steps, act_space):
    ref = sb3.ReplayBuffer(40, BOX, act_space, "cpu", n_envs=n_envs)
    ours = ReplayBuffer(40, BOX, act_space, "cpu", n_envs=n_envs)
    feed([ref, ours], steps, n_envs, BOX, act_space, seed=steps + n_envs)
    assert_arrays_equal(ref, ours)
    for seed in range(3):
        np.random.seed(seed)
        expected = ref.sample(64)
        np.random.seed(seed)
        assert_samples_equal(expected, ours.sample(64))


@pytest.mark.parametrize("n_envs", [1, 2])
def test_dict_observations_same_as_sb3_with_timeouts(n_envs):
    # SB3's DictReplayBuffer cannot store observations once; this one does, timeouts too.
    ref = sb3.DictReplayBuffer(30, DICT, CONTINUOUS, "cpu", n_envs=n_envs)
    ours = DictReplayBuffer(30, DICT, CONTINUOUS, "cpu", n_envs=n_envs)
    feed([ref, ours], 50, n_envs, DICT, CONTINUOUS, seed=n_envs)
    assert_arrays_equal(ref, ours)
    np.random.seed(5)
    expected = ref.sample(32)
    np.random.seed(5)
    assert_samples_equal(expected, ours.sample(32))


@pytest.mark.parametrize("n_steps", [1, 2, 4])
@pytest.mark.parametrize("n_envs", [1, 2])
def test_n_step_same_as_sb3(n_steps, n_envs):
    kwargs = dict(n_envs=n_envs, n_steps=n_steps, gamma=0.9)
    ref = sb3.NStepReplayBuffer(25, BOX, CONTINUOUS, "cpu", **kwargs)
    ours = NStepReplayBuffer(25, BOX, CONTINUOUS, "cpu", **kwargs)
    feed([ref, ours], 40, n_envs, BOX, CONTINUOUS, seed=n_steps)
    np.random.seed(1)
    expected = ref.sample(64)
    np.random.seed(1)
    got = ours.sample(64)
    assert_samples_equal(expected, got)
    assert got.discounts is not None and got.discounts.shape == (64, 1)


@pytest.mark.parametrize(
    ("buffer_size", "n_envs"), [(1, 1), (2, 2), (3, 2)], ids=["1x1", "2x2", "3x2"]
)
def test_one_transition_per_env_same_as_sb3(buffer_size, n_envs):
    """buffer_size // n_envs == 1: each add replaces the only transition of an env, and
    its next observation stays its own across episode ends."""
    ref = sb3.ReplayBuffer(buffer_size, BOX, DISCRETE, "cpu", n_envs=n_envs)
    ours = ReplayBuffer(buffer_size, BOX, DISCRETE, "cpu", n_envs=n_envs)
    prioritized = PrioritizedReplayBuffer(buffer_size, BOX, DISCRETE, "cpu", n_envs=n_envs)
    for steps in range(1, 12):
        feed([ref, ours, prioritized], 1, n_envs, BOX, DISCRETE, seed=steps, continue_prob=0.5)
        assert_arrays_equal(ref, ours)
        assert_arrays_equal(ref, prioritized)
        np.random.seed(steps)
        expected = ref.sample(8)
        np.random.seed(steps)
        assert_samples_equal(expected, ours.sample(8))
        batch = prioritized.sample(8)
        positions, envs = prioritized._ring.transitions_of_slots(batch.keys)
        np.testing.assert_array_equal(
            batch.next_observations.numpy(), ref.next_observations[positions, envs]
        )


def test_prioritized_dict_with_a_key_named_next_of_another():
    """Observation keys "a" and "next_a": each sampled as itself, not one for the other."""
    space = spaces.Dict(
        {"a": spaces.Box(-1, 1, (2,), np.float32), "next_a": spaces.Box(-1, 1, (2,), np.float32)}
    )
    ref = sb3.DictReplayBuffer(20, space, CONTINUOUS, "cpu", n_envs=2)
    ours = PrioritizedDictReplayBuffer(20, space, CONTINUOUS, "cpu", n_envs=2)
    feed([ref, ours], 15, 2, space, CONTINUOUS)
    assert_arrays_equal(ref, ours)
    batch = ours.sample(16)
    positions, envs = ours._ring.transitions_of_slots(batch.keys)
    for key in ("a", "next_a"):
        for name in ("observations", "next_observations"):
            np.testing.assert_array_equal(
                getattr(batch, name)[key].numpy(), getattr(ref, name)[key][positions, envs]
            )


def test_observations_stored_once_and_final_ones_freed():
    ours = ReplayBuffer(100, BOX, DISCRETE, "cpu", n_envs=2)
    ref = sb3.ReplayBuffer(100, BOX, DISCRETE, "cpu", n_envs=2)
    feed([ours, ref], 400, 2, BOX, DISCRETE, seed=3, continue_prob=0.9)
    ring = ours._ring
    assert ring.store.nbytes == (50 + 1) * 2 * BOX.shape[0] * 4  # one obs per step, once
    # Final observations kept only for the transitions held, slots reused as they leave.
    held = ring.final_at[ring.final_at > 0] - 1
    assert len(set(held.tolist()) | set(ring.free)) == len(held) + len(ring.free)  # each once
    assert len(held) + len(ring.free) == len(ring.side["obs"])
    assert len(ring.side["obs"]) <= 2 * max(8, len(held))
    sb3_bytes = sum(
        a.nbytes
        for a in (ref.observations, ref.next_observations, ref.actions, ref.rewards, ref.dones,
                  ref.timeouts)
    )
    assert ours.nbytes() < sb3_bytes  # the same arrays beside the observations, kept once
    assert_arrays_equal(ref, ours)


def test_vec_normalize_applied_when_sampling():
    class FakeNormalize:
        def normalize_obs(self, obs):
            return obs * 2.0

        def normalize_reward(self, reward):
            return reward - 1.0

    ref = sb3.ReplayBuffer(20, BOX, CONTINUOUS, "cpu")
    ours = ReplayBuffer(20, BOX, CONTINUOUS, "cpu")
    feed([ref, ours], 25, 1, BOX, CONTINUOUS)
    np.random.seed(0)
    expected = ref.sample(16, env=FakeNormalize())
    np.random.seed(0)
    assert_samples_equal(expected, ours.sample(16, env=FakeNormalize()))


def test_reset_size_and_full():
    ours = ReplayBuffer(10, BOX, DISCRETE, "cpu")
    assert ours.size() == 0 and not ours.full and ours.pos == 0
    with pytest.raises(EmptyTableError):
        ours.sample(4)
    feed([ours], 12, 1, BOX, DISCRETE)
    assert (ours.size(), ours.full, ours.pos) == (10, True, 2)
    ours.reset()
    assert (ours.size(), ours.full, ours.pos) == (0, False, 0)
    assert not ours.rewards.any() and not ours.dones.any()
    ours.full = True  # SB3's zero-filled arrays: a full empty buffer samples zeros
    assert ours.size() == 10 and float(ours.sample(8).observations.abs().sum()) == 0.0
    with pytest.raises(InvalidArgumentError, match="full"):
        ours.full = False


def test_prioritized_reset_empties_the_table():
    buffer = PrioritizedReplayBuffer(10, BOX, DISCRETE, "cpu", n_envs=2)
    feed([buffer], 7, 2, BOX, DISCRETE)
    assert len(buffer.table) == 10
    buffer.reset()
    assert len(buffer.table) == 0 and buffer.size() == 0
    with pytest.raises(EmptyTableError):
        buffer.sample(2)
    feed([buffer], 3, 2, BOX, DISCRETE)
    assert len(buffer.table) == 6 and buffer.sample(4).weights.shape == (4, 1)


@pytest.mark.parametrize("cls", [ReplayBuffer, NStepReplayBuffer, PrioritizedReplayBuffer])
def test_pickle_round_trip_restores_exactly(cls):
    ours = cls(30, BOX, CONTINUOUS, "cpu", n_envs=2)
    feed([ours], 45, 2, BOX, CONTINUOUS, seed=9)
    if cls is PrioritizedReplayBuffer:
        batch = ours.sample(16)
        ours.update_priorities(batch.keys, np.arange(16) + 1.0)
    saved = io.BytesIO()
    pickle.dump(ours, saved)
    back = pickle.loads(saved.getvalue())
    assert_arrays_equal(ours, back)
    if cls is PrioritizedReplayBuffer:
        np.testing.assert_array_equal(
            ours._ring.held_priorities()[1], back._ring.held_priorities()[1]
        )
        assert back._ring.table.index.max_priority == ours._ring.table.index.max_priority
        # keys sampled before saving still update; the sampler's generator goes on
        # where it was, not from its seed
        assert back.update_priorities(batch.keys, np.ones(16)) == len(set(batch.keys.tolist()))
        ours.update_priorities(batch.keys, np.ones(16))
        for _ in range(3):
            np.testing.assert_array_equal(ours.sample(8).keys, back.sample(8).keys)
    else:
        np.random.seed(2)
        expected = ours.sample(32)
        np.random.seed(2)
        assert_samples_equal(expected, back.sample(32))
    feed([ours, back], 5, 2, BOX, CONTINUOUS, seed=10)  # both go on alike
    assert_arrays_equal(ours, back)


def test_prioritized_sampling_matches_priorities_chi_square():
    alpha = 0.7
    buffer = PrioritizedReplayBuffer(20, BOX, DISCRETE, "cpu", alpha=alpha, eps=1e-9)
    feed([buffer], 20, 1, BOX, DISCRETE)
    keys, _ = buffer._ring.held_priorities()
    td = np.arange(1, 21, dtype=np.float64)
    assert buffer.update_priorities(keys, td) == 20
    expected = td**alpha / (td**alpha).sum()
    counts = np.zeros(20)
    position_of_key = {int(k): i for i, k in enumerate(keys)}
    for _ in range(200):
        batch = buffer.sample(100)
        for key in batch.keys:
            counts[position_of_key[int(key)]] += 1
    _, p_value = stats.chisquare(counts, expected * counts.sum())
    assert p_value > 1e-3
    # Closed-form importance weights: (N * P(i)) ** -beta over the batch's largest.
    batch = buffer.sample(64)
    prob = np.array([expected[position_of_key[int(k)]] for k in batch.keys])
    beta = buffer.current_beta
    weights = (20 * prob) ** -beta
    np.testing.assert_allclose(batch.weights.numpy().ravel(), weights / weights.max(), rtol=1e-5)


def test_prioritized_beta_schedule_and_stale_updates_skipped():
    buffer = PrioritizedReplayBuffer(10, BOX, DISCRETE, "cpu", beta=0.4, final_beta=1.0)
    assert buffer.current_beta == pytest.approx(0.4)
    buffer.progress = 0.5
    assert buffer.current_beta == pytest.approx(0.7)
    buffer.progress = 2.0  # clamped
    assert buffer.current_beta == pytest.approx(1.0)
    with pytest.raises(InvalidArgumentError, match="progress=nan"):
        buffer.progress = float("nan")
    assert buffer.current_beta == pytest.approx(1.0)  # unchanged
    buffer.progress = 0.5
    feed([buffer], 10, 1, BOX, DISCRETE)
    old = buffer.sample(8)
    feed([buffer], 10, 1, BOX, DISCRETE, seed=1)  # every transition replaced
    assert buffer.update_priorities(old.keys, np.ones(8)) == 0
    assert buffer.stale_updates == 8
    fresh = buffer.sample(4)
    assert buffer.update_priorities(fresh.keys, th.ones(4)) == len(set(fresh.keys.tolist()))


def test_prioritized_dict_and_n_step_samples():
    buffer = PrioritizedDictReplayBuffer(20, DICT, CONTINUOUS, "cpu", n_envs=2, n_steps=3)
    feed([buffer], 15, 2, DICT, CONTINUOUS)
    batch = buffer.sample(8)
    assert set(batch.observations) == {"pos", "img"} and batch.observations["img"].dtype == th.uint8
    assert batch.discounts.shape == (8, 1) and batch.weights.shape == (8, 1)
    # The n-step part agrees with the uniform n-step buffer on the same positions.
    positions, envs = buffer._ring.transitions_of_slots(batch.keys)
    plain = DictReplayBuffer(20, DICT, CONTINUOUS, "cpu", n_envs=2, n_steps=3)
    feed([plain], 15, 2, DICT, CONTINUOUS)
    same = plain._samples(positions, envs, None)
    np.testing.assert_allclose(batch.rewards.numpy(), same[4].numpy())
    np.testing.assert_array_equal(batch.next_observations["pos"].numpy(), same[2]["pos"].numpy())


def test_bad_input_is_refused_and_changes_nothing():
    buffer = ReplayBuffer(10, BOX, DISCRETE, "cpu", n_envs=2)
    feed([buffer], 3, 2, BOX, DISCRETE)
    before = (buffer.pos, buffer.observations.copy(), buffer.actions.copy())
    good = dict(
        obs=np.zeros((2, 3), np.float32),
        next_obs=np.zeros((2, 3), np.float32),
        action=np.zeros(2, np.int64),
        reward=np.zeros(2),
        done=np.zeros(2),
        infos=[{}, {}],
    )
    for name, bad in (
        ("obs", np.zeros((2, 4))),
        ("next_obs", np.zeros(3)),
        ("action", np.zeros(3)),
        ("reward", np.zeros(1)),
        ("done", np.zeros(5)),
        ("infos", [{}]),
        ("reward", None),  # numpy would store None as NaN, and as False for done
        ("done", None),
        ("action", ["left", "right"]),
    ):
        with pytest.raises(InvalidArgumentError, match=name):
            buffer.add(**{**good, name: bad})
    assert buffer.pos == before[0]
    np.testing.assert_array_equal(buffer.observations, before[1])
    np.testing.assert_array_equal(buffer.actions, before[2])
    with pytest.raises(InvalidArgumentError, match="DictReplayBuffer"):
        ReplayBuffer(10, DICT, DISCRETE)
    with pytest.raises(InvalidArgumentError, match="buffer_size"):
        ReplayBuffer(0, BOX, DISCRETE)
    with pytest.raises(InvalidArgumentError, match="alpha"):
        PrioritizedReplayBuffer(10, BOX, DISCRETE, alpha=2.0)
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        buffer.sample(0)
    with pytest.raises(InvalidArgumentError, match="pos"):
        buffer.pos = 7


IMAGE = spaces.Box(0, 255, (3, 8, 8), np.uint8)


@pytest.mark.parametrize(
    ("space", "n_envs", "obs", "said"),
    [
        (IMAGE, 1, np.zeros((1, 8, 8, 3), np.uint8), "shape (1, 8, 8, 3)"),  # HWC for CHW
        (BOX, 2, np.zeros((1, 6), np.float32), "shape (1, 6)"),  # two envs run together
        (BOX, 2, np.zeros(6, np.float32), "shape (6,)"),
        (BOX, 1, {"pos": np.zeros(3)}, "a dict with keys ['pos']"),
        (BOX, 4, np.zeros((1, 3), np.float32), "made for n_envs=4"),  # loaded into 1 env
    ],
    ids=["hwc-for-chw", "envs-in-one-row", "envs-flat", "dict-for-array", "one-env-of-four"],
)
def test_observations_of_another_shape_with_as_many_values_are_refused(space, n_envs, obs, said):
    buffer = ReplayBuffer(10, space, DISCRETE, "cpu", n_envs=n_envs)
    rest = (np.zeros(n_envs, np.int64), np.zeros(n_envs), np.zeros(n_envs), [{}] * n_envs)
    with pytest.raises(InvalidArgumentError, match="obs") as caught:
        buffer.add(obs, obs, *rest)
    assert said in str(caught.value)
    assert buffer.size() == 0


@pytest.mark.parametrize(
    ("space", "n_envs", "obs"),
    [
        (BOX, 1, np.arange(3, dtype=np.float32)),  # no env axis, as SB3 broadcasts
        (spaces.Discrete(5), 2, np.array([1, 4])),  # SB3 stores a Discrete obs as (1,)
        (BOX, 2, np.arange(6, dtype=np.float32).reshape(2, 1, 3)),
    ],
    ids=["no-env-axis", "discrete", "extra-axis-of-1"],
)
def test_observations_differing_by_axes_of_one_are_stored_as_sb3_stores_them(space, n_envs, obs):
    """The same values in the same order; where SB3 cannot broadcast (an extra axis of
    1) it gets them in its own shape."""
    ref = sb3.ReplayBuffer(10, space, DISCRETE, "cpu", n_envs=n_envs)
    ours = ReplayBuffer(10, space, DISCRETE, "cpu", n_envs=n_envs)
    rest = (np.zeros(n_envs, np.int64), np.zeros(n_envs), np.zeros(n_envs), [{}] * n_envs)
    ours.add(obs, obs, *rest)
    as_sb3 = obs.reshape(n_envs, -1) if obs.ndim == 3 else obs
    ref.add(as_sb3, as_sb3, *rest)
    assert_arrays_equal(ref, ours)


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ((1, 2), "the key 1"),
        (("",), "the key ''"),
        (("a", "a/b"), "the key 'a/b'"),
        ((), "no keys"),
    ],
    ids=["int", "empty", "slash", "none"],
)
def test_dict_spaces_whose_keys_cannot_name_fields_are_refused(keys, said):
    space = spaces.Dict({key: spaces.Box(-1, 1, (2,), np.float32) for key in keys})
    with pytest.raises(InvalidArgumentError, match="observation_space") as caught:
        DictReplayBuffer(10, space, DISCRETE, "cpu")
    assert said in str(caught.value)


@pytest.mark.parametrize(
    "inner", [spaces.Dict({"b": spaces.Box(0, 1, (2,))}), spaces.Tuple((spaces.Discrete(2),))],
    ids=["dict", "tuple"],
)
def test_dict_spaces_that_nest_spaces_are_refused_naming_the_key(inner):
    space = spaces.Dict({"pos": spaces.Box(0, 1, (2,)), "goal": inner})
    with pytest.raises(InvalidArgumentError, match=r"nests a .* space under the key 'goal'"):
        DictReplayBuffer(10, space, DISCRETE, "cpu")


def test_a_prioritized_buffer_whose_priorities_never_come_back_warns_once():
    buffer = PrioritizedReplayBuffer(20, BOX, DISCRETE, "cpu", eps=np.float32(1e-3))
    feed([buffer], 20, 1, BOX, DISCRETE)
    with pytest.warns(RuntimeWarning, match="no update_priorities call") as caught:
        for _ in range(2_000):
            batch = buffer.sample(4)
    assert len(caught) == 1
    again = PrioritizedReplayBuffer(20, BOX, DISCRETE, "cpu")
    uniform = PrioritizedReplayBuffer(20, BOX, DISCRETE, "cpu", alpha=0.0)  # by choice
    feed([again, uniform], 20, 1, BOX, DISCRETE)
    again.update_priorities(again.sample(4).keys, np.ones(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2_000):
            again.sample(4)
            uniform.sample(4)
    del batch


def test_import_rlreplay_imports_neither_sb3_nor_torch():
    code = (
        "import sys, rlreplay; bad = [m for m in ('stable_baselines3', 'torch') "
        "if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- compiled sampling
# The compiled draws and gathers (``_sb3_transitions.c``) against their numpy paths, called
# side by side on the same buffers: the same numbers, arrays and generator state.
# Skipped where the extension is not built or RLREPLAY_NO_EXTENSION=1 turned it off.
kernel = ring_steps._kernel
compiled = pytest.mark.skipif(kernel is None, reason="the compiled sampling is not in use")


def assert_transitions_equal(expected, got):
    for part, (x, y) in enumerate(zip(expected, got)):
        for key in x if isinstance(x, dict) else [None]:
            a, b = (x[key], y[key]) if key is not None else (x, y)
            assert a.dtype == b.dtype and a.shape == b.shape, (part, key)
            np.testing.assert_array_equal(a, b, err_msg=f"part {part}, {key}")


@compiled
@pytest.mark.parametrize("high", [1, 2, 3, 7, 40, 1000, 2**16 + 1, 2**31 + 7, 2**32])
@pytest.mark.parametrize("size", [0, 1, 33, 500])
def test_compiled_randint_gives_numpys_numbers_and_state(high, size):
    np.random.seed(high % 1000 + size)
    expected = np.random.randint(0, high, size=size)
    after = np.random.get_state()
    np.random.seed(high % 1000 + size)
    got = ring_steps._randint_compiled(high, size)
    assert got.dtype == np.int64 and got.shape == (size,)
    np.testing.assert_array_equal(got, expected)
    state = np.random.get_state()
    assert state[2] == after[2] and np.array_equal(state[1], after[1])


@compiled
@pytest.mark.parametrize("high", [0, -3, 2**32 + 1])
def test_compiled_randint_refuses_a_bound_outside_its_range(high):
    before = np.random.get_state()
    with pytest.raises(ValueError, match=r"must be in 1 \.\. 2"):
        kernel.randint(np.random.get_bit_generator().capsule, high, np.empty(4, np.int64))
    assert np.array_equal(np.random.get_state()[1], before[1])


RING_CASES = {
    # name: (buffer class, obs space, action space, buffer_size, n_envs, adds)
    "one-env-not-full": (ReplayBuffer, BOX, DISCRETE, 40, 1, 30),
    "one-env-turned": (ReplayBuffer, BOX, CONTINUOUS, 40, 1, 95),
    "two-envs-turned": (ReplayBuffer, BOX, DISCRETE, 40, 2, 77),
    "three-envs-exactly-full": (ReplayBuffer, BOX, CONTINUOUS, 30, 3, 10),
    "one-transition-per-env": (ReplayBuffer, BOX, CONTINUOUS, 2, 2, 9),
    "dict-two-envs-turned": (DictReplayBuffer, DICT, CONTINUOUS, 30, 2, 50),
    "prioritized-dict": (PrioritizedDictReplayBuffer, DICT, DISCRETE, 24, 2, 31),
}


@compiled
@pytest.mark.parametrize("case", RING_CASES.values(), ids=RING_CASES)
def test_compiled_transitions_equal_the_numpy_path(case):
    cls, obs_space, act_space, size, n_envs, adds = case
    buffer = cls(size, obs_space, act_space, "cpu", n_envs=n_envs)
    feed([buffer], adds, n_envs, obs_space, act_space, seed=adds, continue_prob=0.6)
    ring = buffer._ring
    assert ring.final_at.any() or ring.per_env == 1  # some next observations are final ones
    rng = np.random.default_rng(adds)
    positions = rng.integers(0, ring.size, 200)
    envs = rng.integers(0, n_envs, 200)
    expected = ring._transitions_numpy(positions, envs, buffer._steps)
    assert_transitions_equal(expected, ring._transitions_compiled(positions, envs, buffer._steps))
    # numpy's indexing counts negative positions and environments from the end
    back = (positions - ring.per_env, envs - n_envs)
    assert_transitions_equal(expected, ring._transitions_compiled(*back, buffer._steps))
    empty = np.zeros(0, np.int64)
    assert_transitions_equal(
        ring._transitions_numpy(empty, empty, buffer._steps),
        ring._transitions_compiled(empty, empty, buffer._steps),
    )


def _kernel_call(buffer, drawn, envs, outs, **changes):
    ring = buffer._ring
    args = dict(
        positions=np.array(drawn, np.int64),
        envs=np.array(envs, np.int64),
        ring=(ring.count, ring.per_env, ring.n_envs),
        columns=ring.columns,
        side=tuple(ring.side.values()),
        final_at=ring.final_at,
        steps=buffer._steps,
        outs=outs,
    )
    args.update(changes)
    return kernel.transitions(*args.values())


BAD_KERNEL_CALLS = {
    # name: (positions, envs, changed argument, error, message)
    "position-past-the-end": ([0, 5], [0, 0], {}, IndexError, "index 5 is out of bounds"),
    "position-before-the-start": ([0, -6], [0, 0], {}, IndexError, "index -6 is out"),
    "env-past-the-end": ([0, 1], [0, 2], {}, IndexError, "for environments of size 2"),
    "ring-too-large": ([0, 1], [0, 0], {"ring": (4, 2**62, 4)}, ValueError, "fewer than 2"),
    "final-at-of-another-dtype": (
        [0, 1], [0, 0], {"final_at": np.zeros(10, np.uint32)}, TypeError, "final_at must"
    ),
    "positions-not-contiguous": (
        [0, 1], [0, 0], {"positions": np.arange(4)[::2]}, TypeError, "C-contiguous"
    ),
    "outs-of-another-batch": ([0, 1, 2], [0, 1, 0], {}, ValueError, "rows of"),
}


@compiled
@pytest.mark.parametrize("case", BAD_KERNEL_CALLS.values(), ids=BAD_KERNEL_CALLS)
def test_compiled_transitions_refuse_bad_calls_and_write_nothing(case):
    positions, envs, changes, error, message = case
    buffer = ReplayBuffer(10, BOX, CONTINUOUS, "cpu", n_envs=2)
    feed([buffer], 4, 2, BOX, CONTINUOUS)
    outs = (
        (np.full((2, 3), 7.0, np.float32),),
        (np.full((2, 3), 7.0, np.float32),),
        np.full((2, 2), 7.0, np.float32),
        np.full((2, 1), 7.0, np.float32),
        np.full((2, 1), 7.0, np.float32),
    )
    with pytest.raises(error, match=message):
        _kernel_call(buffer, positions, envs, outs, **changes)
    assert all((np.asarray(o) == 7.0).all() for o in (*outs[0], *outs[1], *outs[2:]))


@pytest.mark.parametrize("cls", [sb3.ReplayBuffer, ReplayBuffer])
def test_get_samples_indexes_as_numpy_does(cls):
    # SB3's _get_samples indexes its arrays: negative positions count from the end, and a
    # position past the end is an IndexError (on the compiled path too)
    buffer = cls(4, BOX, CONTINUOUS, "cpu")
    feed([buffer], 6, 1, BOX, CONTINUOUS)
    last = buffer._get_samples(np.array([3])).observations
    assert th.equal(buffer._get_samples(np.array([-1])).observations, last)
    with pytest.raises(IndexError):
        buffer._get_samples(np.array([4]))


@pytest.mark.parametrize("base", [ReplayBuffer, DictReplayBuffer])
def test_sample_goes_through_get_samples_as_sb3s_does(base):
    # a subclass that changes _get_samples (augmentation, say) changes what sample() gives
    class Flipped(base):
        def _get_samples(self, batch_inds, env=None):
            samples = super()._get_samples(batch_inds, env)
            return samples._replace(rewards=-samples.rewards)

    space = DICT if base is DictReplayBuffer else BOX
    plain, flipped = base(20, space, CONTINUOUS, "cpu"), Flipped(20, space, CONTINUOUS, "cpu")
    feed([plain, flipped], 10, 1, space, CONTINUOUS)
    np.random.seed(3)
    expected = plain.sample(8).rewards
    np.random.seed(3)
    assert th.equal(flipped.sample(8).rewards, -expected)
