"""A rejected adder call changes nothing: the next valid calls give the items they would
have given without it, and the error is typed and names the argument."""

from __future__ import annotations

import numpy as np
import pytest
from counting_env import make_vec
from hypothesis import given, settings
from hypothesis import strategies as st

from rlreplay import (
    ClosedError,
    EpisodeAdder,
    Fifo,
    InvalidArgumentError,
    NStepTransitionAdder,
    SequenceAdder,
    SequenceItems,
    SignatureError,
    Table,
    TrajectoryWriter,
)

NUM_ENVS = 2
EXTRAS = {"logp": "float32"}


def make_adder(kind: str, mode: str = "next_step", num_envs: int | None = NUM_ENVS):
    """An adder of ``kind`` over a Fifo table (every item sampled once, in order)."""
    shape = {"obs": ((3,), "float32"), "action": "int64", "extras": EXTRAS}
    if kind == "nstep":
        sig = NStepTransitionAdder.signature(**shape)
        layout = NStepTransitionAdder.layout(sig, n=2, stack=2)
    else:
        sig = SequenceAdder.signature(**shape)
        layout = EpisodeAdder.layout(sig, 4) if kind == "episode" else SequenceAdder.layout(sig, 3)
    table = Table(
        "t", signature=sig, capacity=512, layout=layout, sampler=Fifo(), max_times_sampled=1
    )
    common = {"num_envs": num_envs, "autoreset_mode": mode, "chunk_length": 3}
    if kind == "nstep":
        adder = NStepTransitionAdder(table, n=2, discount=0.5, stack=2, **common)
    elif kind == "episode":
        adder = EpisodeAdder(table, 4, **common)
    else:
        adder = SequenceAdder(table, 3, 2, **common)
    return table, adder


def items(table: Table) -> dict[str, np.ndarray]:
    return table.sample(table.size).data if table.size else {}


def assert_same_items(a: Table, b: Table) -> None:
    da, db = items(a), items(b)
    assert da.keys() == db.keys()
    for key in da:
        np.testing.assert_array_equal(da[key], db[key], err_msg=key)


def play(mode: str, seed: int, steps: int) -> tuple[np.ndarray, list[dict]]:
    """First observations and the ``add`` arguments of ``steps`` CountingEnv steps."""
    envs, first = make_vec(NUM_ENVS, mode, seed, max_len=5)
    rng = np.random.default_rng(seed)
    calls = []
    for _ in range(steps):
        action = rng.integers(5, size=NUM_ENVS)
        obs, reward, term, trunc, info = envs.step(action)
        extras = {"logp": action * np.float32(0.5)}
        calls.append(
            {
                "action": action,
                "reward": reward,
                "next_obs": obs,
                "terminated": term,
                "truncated": trunc,
                "info": info,
                "extras": extras,
            }
        )
    envs.close()
    return first, calls


def _drop_env(call):
    return {**call, "next_obs": call["next_obs"][:-1]}


def _same_step_info(call):
    final = np.empty(NUM_ENVS, dtype=object)
    final[:] = list(call["next_obs"])
    return {**call, "info": {"final_obs": final, "_final_obs": np.ones(NUM_ENVS, bool)}}


# name -> (corrupt a valid add() call, text the error names); "ended" cases apply to a
# step where an episode ends, "next_step"/"same_step" ones to that autoreset mode only.
BAD_ADDS = {
    "next_obs_trailing_shape": (lambda c: {**c, "next_obs": c["next_obs"][:, :2]}, "next_obs"),
    "next_obs_one_env_short": (_drop_env, "next_obs"),
    "float_action_for_int_column": (lambda c: {**c, "action": c["action"] + 0.5}, "action"),
    "action_with_extra_axis": (lambda c: {**c, "action": c["action"][:, None]}, "action"),
    "reward_with_extra_axis": (lambda c: {**c, "reward": c["reward"][:, None]}, "reward"),
    "complex_reward": (lambda c: {**c, "reward": c["reward"] + 1j}, "reward"),
    "extras_missing": (lambda c: {**c, "extras": None}, "logp"),
    "extras_unknown_field": (lambda c: {**c, "extras": {**c["extras"], "x": c["reward"]}}, "x"),
    "extras_wrong_shape": (lambda c: {**c, "extras": {"logp": np.zeros((NUM_ENVS, 2))}}, "logp"),
    "extras_not_a_dict": (lambda c: {**c, "extras": [1.0, 2.0]}, "extras"),
    "terminated_wrong_shape": (lambda c: {**c, "terminated": c["terminated"][:1]}, "terminated"),
    "truncated_floats": (
        lambda c: {**c, "truncated": c["truncated"].astype(np.float64)},
        "truncated",
    ),
    "info_not_a_dict": (lambda c: {**c, "info": [c["info"]]}, "info"),
    # ints other than 0/1 (a step counter passed by mistake) are not read as "done"
    "terminated_minus_one": (
        lambda c: {**c, "terminated": np.full(NUM_ENVS, -1, np.int64)},
        "terminated",
    ),
    "truncated_two": (
        lambda c: {**c, "truncated": np.full(NUM_ENVS, 2, np.int32)},
        "truncated",
    ),
}
BAD_ENDING_ADDS = {
    "next_step": {"same_step_info": (_same_step_info, "same_step")},
    "same_step": {
        "final_obs_missing": (lambda c: {**c, "info": {}}, "next_step"),
        "final_obs_wrong_shape": (
            lambda c: {**c, "info": {"final_obs": np.zeros((NUM_ENVS, 4), np.float32)}},
            "final_obs",
        ),
        "final_obs_empty": (
            lambda c: {**c, "info": {"final_obs": np.empty(0, dtype=object)}},
            "final_obs",
        ),
    },
}
BAD_OTHER_CALLS = {
    "reset_obs_wrong_shape": (lambda a, f: a.reset(f[:, :2]), "obs"),
    "reset_env_id_out_of_range": (lambda a, f: a.reset(f[:1], env_ids=[NUM_ENVS]), "env_ids"),
    "reset_env_ids_repeated": (lambda a, f: a.reset(f, env_ids=[0, 0]), "env_ids"),
    "reset_env_ids_floats": (lambda a, f: a.reset(f[:1], env_ids=[0.0]), "env_ids"),
    "reset_more_obs_than_env_ids": (lambda a, f: a.reset(f, env_ids=[1]), "environments"),
    "reset_complex_obs_for_float_column": (lambda a, f: a.reset(f.astype(np.complex64)), "obs"),
    "end_episode_env_id_negative": (lambda a, f: a.end_episode(env_ids=[-1]), "env_ids"),
    "end_episode_terminated_not_bool": (lambda a, f: a.end_episode("yes"), "terminated"),
}


def run(kind, mode, seed, steps, bad=None, at=None):
    """Feed the played steps to a new adder; call ``bad(adder, call)`` before step ``at``
    and check that it raises. Returns the table and the adder (closed)."""
    first, calls = play(mode, seed, steps)
    table, adder = make_adder(kind, mode)
    adder.reset(first)
    for t, call in enumerate(calls):
        if t == at:
            bad(adder, call, first)
        adder.add(**call)
    adder.close()
    return table, adder


def counters(adder) -> tuple:
    return (adder.appended_rows, adder.copied_rows, adder.items_created, adder.episodes)


def first_ending_step(mode: str, seed: int, steps: int) -> int:
    _, calls = play(mode, seed, steps)
    return next(t for t, c in enumerate(calls) if (c["terminated"] | c["truncated"]).any())


def rejects(corrupt, text):
    def bad(adder, call, first):
        with pytest.raises(InvalidArgumentError, match=text):
            adder.add(**corrupt(call))

    return bad


CASES = [
    pytest.param(mode, corrupt, text, False, id=f"{mode}-{name}")
    for mode in ("next_step", "same_step")
    for name, (corrupt, text) in BAD_ADDS.items()
] + [
    pytest.param(mode, corrupt, text, True, id=f"{mode}-{name}")
    for mode, cases in BAD_ENDING_ADDS.items()
    for name, (corrupt, text) in cases.items()
]


@pytest.mark.parametrize("kind", ["nstep", "sequence", "episode"])
@pytest.mark.parametrize(("mode", "corrupt", "text", "ending"), CASES)
def test_rejected_add_changes_nothing(kind, mode, corrupt, text, ending):
    steps = 14
    at = first_ending_step(mode, 3, steps) if ending else 5
    expected, ref = run(kind, mode, 3, steps)
    table, adder = run(kind, mode, 3, steps, rejects(corrupt, text), at)
    assert_same_items(table, expected)
    assert counters(adder) == counters(ref)


@pytest.mark.parametrize(
    ("call", "text"), [pytest.param(c, t, id=n) for n, (c, t) in BAD_OTHER_CALLS.items()]
)
def test_rejected_reset_or_end_episode_changes_nothing(call, text):
    expected, ref = run("nstep", "next_step", 4, 14)

    def bad(adder, step, first):
        with pytest.raises(InvalidArgumentError, match=text):
            call(adder, first)

    table, adder = run("nstep", "next_step", 4, 14, bad, 6)
    assert_same_items(table, expected)
    assert counters(adder) == counters(ref)


def test_float_action_for_an_int_column_is_refused_at_add_and_the_adder_goes_on():
    table, adder = make_adder("nstep", num_envs=None)
    adder.reset(np.zeros(3, np.float32))
    with pytest.raises(SignatureError, match="action"):
        adder.add(1.5, 1.0, np.ones(3, np.float32), False, False, extras={"logp": 0.0})
    adder.add(1, 1.0, np.ones(3, np.float32), True, False, extras={"logp": 0.0})
    data = items(table)
    assert data["action"].tolist() == [1]
    np.testing.assert_array_equal(data["next_obs"][0, -1], np.ones(3))


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_done_flags_take_bools_and_0_or_1_only(flag):
    table, adder = make_adder("nstep", num_envs=None)
    adder.reset(np.zeros(3, np.float32))
    step = {"action": 1, "reward": 1.0, "next_obs": np.ones(3, np.float32)}
    step.update(terminated=False, truncated=False, extras={"logp": 0.0})
    for bad in (2, -1, np.int64(3), np.array(2, np.uint8)):
        with pytest.raises(InvalidArgumentError, match=f"{flag}=.*0 and 1"):
            adder.add(**{**step, flag: bad})
    adder.add(**{**step, flag: 0})  # 0 and 1 stand for False and True
    assert table.size == 0
    adder.add(**{**step, flag: np.int64(1)})
    assert items(table)["action"].tolist() == [1, 1]


def test_wrong_next_obs_leaves_no_phantom_step():
    table, adder = make_adder("nstep", num_envs=None)
    adder.reset(np.zeros(3, np.float32))
    with pytest.raises(SignatureError, match="next_obs"):
        adder.add(1, 1.0, np.ones(4, np.float32), False, False, extras={"logp": 0.0})
    adder.add(2, 1.0, np.ones(3, np.float32), True, False, extras={"logp": 0.0})
    data = items(table)
    assert data["action"].tolist() == [2]
    np.testing.assert_array_equal(data["obs"][0, -1], np.zeros(3))
    np.testing.assert_allclose(data["reward"], [1.0])


@pytest.mark.parametrize(
    ("name", "sig", "text"),
    [
        pytest.param(
            "lacks_computed",
            {"obs": "float32", "action": "int64", "reward": "f4"},
            "n_step_return",
            id="signature_without_computed_columns",
        ),
        pytest.param(
            "lacks_obs",
            {
                "o": "float32",
                "action": "int64",
                "reward": "f4",
                "n_step_return": "f4",
                "discount": "f4",
            },
            "obs",
            id="signature_without_obs",
        ),
    ],
)
def test_adder_over_a_signature_it_cannot_fill_is_refused_at_construction(name, sig, text):
    table = Table(name, signature=sig, capacity=64)
    with pytest.raises(InvalidArgumentError, match=text):
        NStepTransitionAdder(TrajectoryWriter(table, history=64), n=1, discount=0.9)


def test_writer_without_a_signature_is_refused():
    class Bare:
        tables = ("t",)
        history = 1000

    with pytest.raises(InvalidArgumentError, match="signature"):
        NStepTransitionAdder(Bare(), n=1, discount=0.9, tables=["t"])


GOOD = "good"
CORRUPTIONS = sorted(BAD_ADDS)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["nstep", "sequence", "episode"]),
    mode=st.sampled_from(["next_step", "same_step"]),
    seed=st.integers(0, 1000),
    script=st.lists(
        st.sampled_from([GOOD] * 8 + [*CORRUPTIONS, "ending", "ending"]), min_size=20, max_size=60
    ),
)
def test_any_mix_of_valid_and_rejected_calls_gives_the_items_of_the_valid_calls(
    kind, mode, seed, script
):
    steps = script.count(GOOD)
    first, calls = play(mode, seed, steps)
    expected, ref = make_adder(kind, mode)
    table, adder = make_adder(kind, mode)
    for a in (ref, adder):
        a.reset(first)
    for call in calls:
        ref.add(**call)
    pending = iter(calls)
    call = next(pending, None)
    for entry in script:
        if call is None:
            break
        if entry == GOOD:
            adder.add(**call)
            call = next(pending, None)
            continue
        ends = bool((call["terminated"] | call["truncated"]).any())
        if entry == "ending":
            if not ends:
                continue
            corrupt = next(iter(BAD_ENDING_ADDS[mode].values()))[0]
        else:
            corrupt = BAD_ADDS[entry][0]
        with pytest.raises(InvalidArgumentError):
            adder.add(**corrupt(call))
    ref.close()
    adder.close()
    assert_same_items(table, expected)
    assert counters(adder) == counters(ref)


@pytest.mark.parametrize(
    ("action", "accepted"),
    [
        pytest.param(np.array([3, 255]), True, id="int64_in_range"),
        pytest.param(np.array([3, 300]), False, id="int64_above_uint8"),
        pytest.param(np.array([-1, 3]), False, id="negative_for_uint8"),
        pytest.param(np.array([True, False]), True, id="bools"),
        pytest.param(np.array([1.0, 2.0]), False, id="whole_floats"),
    ],
)
def test_actions_that_do_not_fit_a_uint8_column_are_refused_at_add(action, accepted):
    sig = NStepTransitionAdder.signature(obs=((3,), "float32"), action="uint8")
    table = Table(
        "t",
        signature=sig,
        capacity=64,
        layout=NStepTransitionAdder.layout(sig, n=1),
        sampler=Fifo(),
        max_times_sampled=1,
    )
    adder = NStepTransitionAdder(table, n=1, discount=0.5, num_envs=2)
    adder.reset(np.zeros((2, 3), np.float32))
    step = (np.ones(2), np.ones((2, 3), np.float32), np.ones(2, bool), np.zeros(2, bool))
    if accepted:
        adder.add(action, *step)
        adder.flush()
        assert sorted(items(table)["action"].tolist()) == sorted(action.astype(int).tolist())
        return
    with pytest.raises(SignatureError, match="action"):
        adder.add(action, *step)
    adder.add(np.array([7, 8]), *step)
    adder.flush()
    assert sorted(items(table)["action"].tolist()) == [7, 8]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param(lambda other: {"tables": ["elsewhere"]}, id="table_name_not_the_writers"),
        pytest.param(lambda other: {"tables": [other]}, id="table_object_not_the_writers"),
        pytest.param(
            lambda other: {"sequence_tables": {other: SequenceItems(2, 2)}},
            id="sequence_table_not_the_writers",
        ),
    ],
)
def test_tables_the_writer_does_not_write_to_are_refused_at_construction(kwargs):
    table, _ = make_adder("nstep")
    other = Table("other", signature=table.store.signature, capacity=64)
    writer = TrajectoryWriter(table, history=64)
    with pytest.raises(InvalidArgumentError, match="not one of the writer's tables"):
        NStepTransitionAdder(writer, n=2, discount=0.5, stack=2, chunk_length=4, **kwargs(other))


def test_one_sequence_rule_given_to_two_adders_serves_each_on_its_own():
    rule = SequenceItems(2, 1, pad_end=False)
    results = []
    for chunk in (1, 3):  # the adders flush at different steps
        sig = SequenceAdder.signature(obs="float32", action="int64")
        base = Table("base", signature=sig, capacity=256, layout=SequenceAdder.layout(sig, 1))
        seq = Table(
            "seq",
            store=base.store,
            layout=SequenceAdder.layout(sig, 2, pad_end=False),
            sampler=Fifo(),
            max_times_sampled=1,
        )
        results.append(
            (
                SequenceAdder(
                    [base, seq],
                    1,
                    1,
                    tables=[base],
                    sequence_tables={seq: rule},
                    chunk_length=chunk,
                ),
                seq,
            )
        )
    for adder, _ in results:
        adder.reset(0.0)
    for t in range(1, 9):  # the two adders interleave, step by step
        for adder, _ in results:
            adder.add(t, 1.0, float(t), t == 8, False)
    for _, seq in results:
        starts = seq.sample(seq.size).data["obs"][:, 0].tolist()
        assert starts == [float(t) for t in range(8)]


def test_one_env_in_same_step_mode_reads_final_obs_as_one_observation():
    table, adder = make_adder("nstep", mode="same_step", num_envs=None)
    adder.reset(np.zeros(3, np.float32))
    extras = {"logp": 0.0}
    adder.add(1, 1.0, np.ones(3, np.float32), False, False, extras=extras)
    final = np.array([2.0, 3.0, 4.0], np.float32)
    reset_obs = np.full(3, 9.0, np.float32)
    adder.add(1, 1.0, reset_obs, True, False, {"final_obs": final}, extras=extras)
    with pytest.raises(InvalidArgumentError, match="final_obs"):
        adder.add(1, 1.0, reset_obs, True, False, {"final_obs": final[:2]}, extras=extras)
    data = items(table)
    np.testing.assert_array_equal(data["obs"][:, -1], [np.zeros(3), np.ones(3)])
    np.testing.assert_array_equal(data["next_obs"][:, -1], [final, final])  # n=2
    adder.close()
    assert table.size == 0  # the new episode (from reset_obs) had no step


def test_every_call_after_close_raises_closed_error_and_close_again_does_nothing():
    _, adder = make_adder("nstep")
    obs = np.zeros((NUM_ENVS, 3), np.float32)
    adder.reset(obs)
    adder.close()
    adder.close()
    calls = {
        "reset": lambda: adder.reset(obs),
        "add": lambda: adder.add(np.zeros(NUM_ENVS, np.int64), np.zeros(NUM_ENVS), obs,
                                 np.zeros(NUM_ENVS, bool), np.zeros(NUM_ENVS, bool)),
        "end_episode": adder.end_episode,
        "hand_over": adder.hand_over,
        "flush": adder.flush,
    }  # fmt: skip
    for name, call in calls.items():
        with pytest.raises(ClosedError, match=rf"{name}\(\) after close"):
            call()


def test_an_nstep_adder_refuses_a_table_whose_layout_has_another_n():
    sig = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")
    table = Table("t", signature=sig, layout=NStepTransitionAdder.layout(sig, n=1), max_size=64)
    with pytest.raises(InvalidArgumentError, match=r"span 2.*n=3.*layout\(signature, n=3"):
        NStepTransitionAdder(table, n=3, discount=0.9)
    NStepTransitionAdder(table, n=1, discount=0.9).close()
