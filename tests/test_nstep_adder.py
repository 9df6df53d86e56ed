"""N-step transitions equal a straightforward reference on random episodes."""

from __future__ import annotations

import numpy as np
import pytest
from counting_env import episodes, make_vec
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay import Fifo, InvalidArgumentError, NStepTransitionAdder, Table


def reference(ep: dict, t: int, n: int, gamma: float, stack: int) -> dict:
    """The n-step item for step ``t`` of a logged episode, computed the obvious way."""
    total = len(ep["rewards"])
    m = min(n, total - t)
    ret = sum(gamma**j * ep["rewards"][t + j] for j in range(m))
    disc = 0.0 if (ep["terminated"] and t + m == total) else gamma**m

    def frames(s: int) -> np.ndarray:
        return np.stack([ep["obs"][max(0, s - stack + 1 + j)] for j in range(stack)])

    return {
        "action": ep["actions"][t],
        "reward": ret,
        "discount": disc,
        "obs": frames(t) if stack > 1 else ep["obs"][t],
        "next_obs": frames(t + m) if stack > 1 else ep["obs"][t + m],
    }


def all_items(table: Table) -> dict:
    """Every item of a Fifo table sampled once (max_times_sampled=1)."""
    return table.sample(table.size).data if table.size else {}


def run_adder(num_envs, mode, seed, n, gamma, stack, chunk, steps, capacity):
    envs, obs = make_vec(num_envs, mode, seed)
    sig = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")
    table = Table(
        "nstep",
        signature=sig,
        capacity=capacity,
        layout=NStepTransitionAdder.layout(sig, n=n, stack=stack),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = NStepTransitionAdder(
        table,
        n=n,
        discount=gamma,
        stack=stack,
        num_envs=num_envs,
        autoreset_mode=mode,
        chunk_length=chunk,
    )
    adder.reset(obs)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        action = rng.integers(5, size=num_envs)
        obs, reward, term, trunc, info = envs.step(action)
        adder.add(action, reward, obs, term, trunc, info)
    adder.end_episode(terminated=False)
    logs = episodes(envs)
    # Episodes still open at the end were ended by the adder as truncated.
    for ep in logs.values():
        ep["terminated"] = ep["terminated"] and len(ep["rewards"]) > 0
    return table, adder, logs


def check_items(data: dict, logs: dict, n: int, gamma: float, stack: int) -> int:
    last = data["obs"][:, -1] if stack > 1 else data["obs"]
    for k in range(len(last)):
        tag, epi, t = (int(v) for v in last[k])
        ref = reference(logs[(tag, epi)], t, n, gamma, stack)
        assert data["action"][k] == ref["action"]
        np.testing.assert_allclose(data["reward"][k], ref["reward"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(data["discount"][k], ref["discount"], rtol=1e-6)
        np.testing.assert_array_equal(data["obs"][k], ref["obs"])
        np.testing.assert_array_equal(data["next_obs"][k], ref["next_obs"])
    return len(last)


def expected_items(logs: dict) -> int:
    """One item per step whose episode ended (terminated, truncated or closed)."""
    return sum(len(ep["rewards"]) for ep in logs.values())


@settings(max_examples=100, deadline=None)
@given(
    num_envs=st.integers(1, 4),
    mode=st.sampled_from(["next_step", "same_step"]),
    seed=st.integers(0, 10_000),
    n=st.integers(1, 5),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    stack=st.integers(1, 3),
    chunk=st.integers(1, 8),
    steps=st.integers(1, 60),
)
def test_nstep_items_match_reference(num_envs, mode, seed, n, gamma, stack, chunk, steps):
    table, _, logs = run_adder(num_envs, mode, seed, n, gamma, stack, chunk, steps, 4096)
    size = table.size
    assert size == expected_items(logs)
    assert check_items(all_items(table), logs, n, gamma, stack) == size


@settings(max_examples=60, deadline=None)
@given(
    num_envs=st.integers(1, 3),
    mode=st.sampled_from(["next_step", "same_step"]),
    seed=st.integers(0, 10_000),
    n=st.integers(1, 4),
    stack=st.integers(1, 4),
    capacity=st.integers(20, 48),
)
def test_nstep_items_stay_correct_when_a_small_ring_wraps(num_envs, mode, seed, n, stack, capacity):
    table, adder, logs = run_adder(num_envs, mode, seed, n, 0.9, stack, 3, 80, capacity)
    assert adder.appended_rows > capacity  # the ring wrapped
    check_items(all_items(table), logs, n, 0.9, stack)


def test_single_env_without_batch_axis_and_termination_zeroes_discount():
    sig = NStepTransitionAdder.signature(obs="float32", action="int64")
    table = Table(
        "t",
        signature=sig,
        max_size=64,
        layout=NStepTransitionAdder.layout(sig, 2),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = NStepTransitionAdder(table, n=2, discount=0.5)
    adder.reset(0.0)
    for t in range(1, 4):
        adder.add(t, 1.0, float(t), t == 3, False)
    data = all_items(table)
    np.testing.assert_allclose(data["reward"], [1.5, 1.5, 1.0])
    np.testing.assert_allclose(data["discount"], [0.25, 0.0, 0.0])
    np.testing.assert_allclose(data["next_obs"], [2.0, 3.0, 3.0])


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"n": 0, "discount": 0.9}, id="n_zero"),
        pytest.param({"n": 2, "discount": 1.5}, id="discount_above_one"),
        pytest.param({"n": 2, "discount": 0.9, "stack": 0}, id="stack_zero"),
        pytest.param({"n": 2, "discount": 0.9, "chunk_length": 0}, id="chunk_zero"),
        pytest.param({"n": 2, "discount": 0.9, "autoreset_mode": "sometimes"}, id="bad_mode"),
        pytest.param({"n": 2, "discount": 0.9, "priority": -1.0}, id="negative_priority"),
        pytest.param({"n": 2, "discount": 0.9, "priority": "high"}, id="priority_not_a_number"),
        pytest.param({"n": 2, "discount": 0.9, "timeout": 0}, id="timeout_zero"),
        pytest.param({"n": 2, "discount": 0.9, "timeout": "1s"}, id="timeout_not_a_number"),
        pytest.param({"n": 2, "discount": 0.9, "num_envs": 0}, id="num_envs_zero"),
    ],
)
def test_bad_adder_arguments_raise_typed_errors(kwargs):
    sig = NStepTransitionAdder.signature(obs="float32", action="int64")
    table = Table("t", signature=sig, max_size=64, layout=NStepTransitionAdder.layout(sig, 2))
    with pytest.raises(InvalidArgumentError):
        NStepTransitionAdder(table, **kwargs)


def test_writer_with_too_short_history_is_rejected():
    from rlreplay import TrajectoryWriter

    sig = NStepTransitionAdder.signature(obs="float32", action="int64")
    table = Table("t", signature=sig, max_size=64, layout=NStepTransitionAdder.layout(sig, 2))
    with pytest.raises(InvalidArgumentError, match="history"):
        NStepTransitionAdder(TrajectoryWriter(table), n=2, discount=0.9)


def test_add_before_reset_is_rejected():
    sig = NStepTransitionAdder.signature(obs="float32", action="int64")
    table = Table("t", signature=sig, max_size=64, layout=NStepTransitionAdder.layout(sig, 2))
    adder = NStepTransitionAdder(table, n=2, discount=0.9)
    with pytest.raises(InvalidArgumentError, match="reset"):
        adder.add(0, 1.0, 1.0, False, False)


def test_reset_of_some_envs_ends_their_episodes_as_truncated():
    sig = NStepTransitionAdder.signature(obs="float32", action="int64")
    table = Table(
        "t",
        signature=sig,
        max_size=256,
        layout=NStepTransitionAdder.layout(sig, 2),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = NStepTransitionAdder(table, n=2, discount=0.5, num_envs=2)
    adder.reset(np.array([0.0, 100.0]))
    adder.add([1, 1], [1.0, 1.0], np.array([1.0, 101.0]), [False, False], [False, False])
    adder.reset(np.array([50.0]), env_ids=[1])  # env 1 cut after one step
    adder.add([2, 2], [1.0, 1.0], np.array([2.0, 51.0]), [False, False], [False, False])
    adder.close()
    data = all_items(table)
    order = np.argsort(data["obs"])
    np.testing.assert_array_equal(data["obs"][order], [0.0, 1.0, 50.0, 100.0])
    np.testing.assert_array_equal(data["next_obs"][order], [2.0, 2.0, 51.0, 101.0])
    np.testing.assert_allclose(data["discount"][order], [0.25, 0.5, 0.5, 0.5])
    np.testing.assert_allclose(data["reward"][order], [1.5, 1.0, 1.0, 1.0])


class MinimalWriter:
    """Only what :class:`rlreplay.runtime.interfaces.Writer` declares, nothing more."""

    def __init__(self, tables, history):
        from rlreplay import TrajectoryWriter

        inner = TrajectoryWriter(tables, history=history)
        self.signature, self.tables, self.history = inner.signature, inner.tables, history
        self.append_batch = inner.append_batch
        self.create_items = inner.create_items
        self.end_episode = inner.end_episode
        self.flush = inner.flush
        self.close = inner.close
        self.__exit__ = inner.__exit__


@pytest.mark.parametrize("member", ["create_items", "history", "__exit__", "signature"])
def test_a_writer_without_a_declared_member_is_refused_naming_it(member):
    sig = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")
    table = Table("t", signature=sig, capacity=256, layout=NStepTransitionAdder.layout(sig, n=2))
    full = MinimalWriter(table, history=64)
    lacking = type("Lacking", (), {
        m: getattr(full, m) for m in ("append_batch", "create_items", "end_episode", "flush",
                                      "close", "signature", "history", "tables")
        if m != member
    })()
    if member != "__exit__":
        lacking.__class__.__exit__ = lambda self, *exc: full.close()
    with pytest.raises(InvalidArgumentError, match=f"it lacks \\['{member}'\\]"):
        NStepTransitionAdder(lacking, n=2, discount=0.9)
    full.close()


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_a_writer_with_only_the_declared_interface_gets_the_same_items(mode):
    results = []
    for minimal in (False, True):
        envs, obs = make_vec(3, mode, seed=11)
        sig = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")
        table = Table(
            "t",
            signature=sig,
            capacity=4096,
            sampler=Fifo(),
            max_times_sampled=1,
            layout=NStepTransitionAdder.layout(sig, n=3, stack=2),
        )
        writer = MinimalWriter(table, history=200) if minimal else table
        adder = NStepTransitionAdder(
            writer, n=3, discount=0.9, stack=2, num_envs=3, autoreset_mode=mode, chunk_length=5
        )
        adder.reset(obs)
        rng = np.random.default_rng(0)
        for _ in range(60):
            action = rng.integers(5, size=3)
            obs, reward, term, trunc, info = envs.step(action)
            adder.add(action, reward, obs, term, trunc, info)
        adder.close()
        logs = episodes(envs)
        size = table.size
        data = all_items(table)
        assert check_items(data, logs, 3, 0.9, 2) == size
        results.append(data)
    for key in results[0]:
        np.testing.assert_array_equal(results[0][key], results[1][key])


def test_dict_observations_are_stored_per_key_and_served_as_next_obs_paths():
    sig = NStepTransitionAdder.signature(
        obs={"pos": ((2,), "float32"), "frame": ((3, 3), "uint8")}, action="int64"
    )
    layout = NStepTransitionAdder.layout(sig, n=1)
    table = Table(
        "t", signature=sig, max_size=64, layout=layout, sampler=Fifo(), max_times_sampled=1
    )
    adder = NStepTransitionAdder(table, n=1, discount=0.9, num_envs=2)

    def obs(t):
        return {"pos": np.full((2, 2), t, np.float32), "frame": np.full((2, 3, 3), t, np.uint8)}

    adder.reset(obs(0))
    for t in range(1, 4):
        adder.add([t, t], [1.0, 1.0], obs(t), [t == 3] * 2, [False, False])
    adder.flush()
    data = table.sample(table.size).tree()
    np.testing.assert_array_equal(data["next_obs"]["pos"][:, 0], data["obs"]["pos"][:, 0] + 1)
    np.testing.assert_array_equal(
        data["next_obs"]["frame"][:, 0, 0], data["obs"]["frame"][:, 0, 0] + 1
    )
    assert sorted(data["action"].tolist()) == [1, 1, 2, 2, 3, 3]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 4),
    steps=st.integers(1, 9),
    chunk=st.sampled_from([1, 2, 3, 64]),
    flushed=st.booleans(),
)
def test_end_episode_terminated_makes_the_last_transitions_terminal_whatever_was_written(
    n, steps, chunk, flushed
):
    """An episode every add() reported open, ended by end_episode(terminated=True): the
    items whose returns reach its end do not bootstrap, whether or not a flush or a full
    chunk had already written their rows."""
    from rlreplay import SequenceAdder

    sig = NStepTransitionAdder.signature(obs=((1,), "float32"), action="int64")
    table = Table("t", signature=sig, layout=NStepTransitionAdder.layout(sig, n=n),
                  max_size=64, capacity=256, sampler=Fifo(), remover=Fifo(),
                  max_times_sampled=1)  # fmt: skip
    adder = NStepTransitionAdder(table, n=n, discount=0.9, chunk_length=chunk)
    adder.reset(np.zeros(1, np.float32))
    for t in range(steps):
        adder.add(0, 1.0, np.full(1, t + 1, np.float32), False, False)
    if flushed:
        adder.flush()
    adder.end_episode(terminated=True)
    adder.flush()
    data = table.sample(table.size).data
    left = steps - data["obs"][:, 0].astype(int)  # steps from each item's step to the end
    expected = np.where(left <= n, 0.0, 0.9**n)
    np.testing.assert_allclose(data["discount"], expected, rtol=1e-6)
    assert len(left) == steps

    seq_sig = SequenceAdder.signature(obs=((1,), "float32"), action="int64")
    seq_table = Table("s", signature=seq_sig, layout=SequenceAdder.layout(seq_sig, steps + 1),
                      max_size=8, capacity=256, max_times_sampled=1)  # fmt: skip
    seq = SequenceAdder(seq_table, length=steps + 1, period=steps + 1, discount=0.9,
                        chunk_length=chunk)  # fmt: skip
    seq.reset(np.zeros(1, np.float32))
    for t in range(steps):
        seq.add(0, 1.0, np.full(1, t + 1, np.float32), False, False)
    if flushed:
        seq.flush()
    seq.end_episode(terminated=True)
    seq.flush()
    discount = seq_table.sample(1).data["discount"][0]
    np.testing.assert_allclose(discount, [0.9] * (steps - 1) + [0.0, 0.0], rtol=1e-6)
