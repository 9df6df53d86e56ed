"""Minari datasets: episodes of step rows out, read back by Minari's own reader, and in again
(into a table of rows, or through an adder); refusals that write or insert nothing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

minari = pytest.importorskip("minari")
pytest.importorskip("h5py")
gym = pytest.importorskip("gymnasium")

from rlreplay import (  # noqa: E402
    DatasetError,
    EpisodeAdder,
    InvalidArgumentError,
    ItemLayout,
    NStepTransitionAdder,
    SignatureError,
    StepStore,
    Table,
)
from rlreplay.datasets.minari import export_minari, import_minari  # noqa: E402

SIG = {
    "obs": ((4,), "float32"),
    "action": "int64",
    "reward": "float32",
    "terminated": "bool",
    "truncated": "bool",
    "next_obs": ((4,), "float32"),
}
META = {
    "author": "rlreplay tests",
    "author_email": "-",
    "code_permalink": "-",
    "algorithm_name": "random",
    "description": "test",
    "eval_env": "CartPole-v1",
}


@pytest.fixture(autouse=True)
def minari_root(tmp_path, monkeypatch):
    """Every dataset of a test under its tmp_path, never the home directory."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari's advice on missing metadata
        yield tmp_path / "minari"


def cartpole_episodes(n: int, seed: int = 0, max_steps: int = 30) -> list[dict]:
    """``n`` episodes of a random CartPole policy (time limit ``max_steps``: some end
    truncated), as Minari's fields."""
    env = gym.make("CartPole-v1", max_episode_steps=max_steps)
    env.action_space.seed(seed)
    episodes = []
    for i in range(n):
        obs, _ = env.reset(seed=seed + i)
        ep = {
            "observations": [obs],
            "actions": [],
            "rewards": [],
            "terminations": [],
            "truncations": [],
        }
        done = False
        while not done:
            action = env.action_space.sample()
            obs, reward, term, trunc, _ = env.step(action)
            for k, v in (
                ("observations", obs),
                ("actions", action),
                ("rewards", reward),
                ("terminations", term),
                ("truncations", trunc),
            ):
                ep[k].append(v)
            done = term or trunc
        episodes.append({k: np.array(v) for k, v in ep.items()})
    return episodes


def step_rows(episodes: list[dict]) -> dict[str, np.ndarray]:
    """The episodes as step rows (the columns of SIG)."""
    cat = lambda k, sl: np.concatenate([e[k][sl] for e in episodes])  # noqa: E731
    every = slice(None)
    return {
        "obs": cat("observations", slice(None, -1)),
        "action": cat("actions", every),
        "reward": cat("rewards", every),
        "terminated": cat("terminations", every),
        "truncated": cat("truncations", every),
        "next_obs": cat("observations", slice(1, None)),
    }


def rows_table(capacity: int = 2000, **kwargs) -> Table:
    return Table("replay", signature=SIG, capacity=capacity, **kwargs)


def assert_same_episodes(dataset, episodes: list[dict]) -> None:
    read = list(dataset.iterate_episodes())
    assert len(read) == len(episodes)
    for got, want in zip(read, episodes):
        np.testing.assert_array_equal(got.observations, want["observations"])
        np.testing.assert_array_equal(got.actions, want["actions"])
        np.testing.assert_array_equal(got.rewards, want["rewards"].astype(np.float32))
        np.testing.assert_array_equal(got.terminations, want["terminations"])
        np.testing.assert_array_equal(got.truncations, want["truncations"])


def test_minari_round_trip_of_20_cartpole_episodes_read_by_minari_itself(minari_root):
    episodes = cartpole_episodes(20)
    assert any(e["truncations"][-1] for e in episodes)
    assert any(e["terminations"][-1] for e in episodes)
    table = rows_table()
    table.insert(step_rows(episodes))
    env = gym.make("CartPole-v1")
    export_minari(
        table,
        "cartpole/random-v0",
        observation_space=env.observation_space,
        action_space=env.action_space,
        **META,
    )
    dataset = minari.load_dataset("cartpole/random-v0")  # Minari's own reader
    assert (minari_root / "cartpole" / "random-v0").is_dir()
    assert dataset.total_episodes == 20
    assert dataset.total_steps == table.store.num_steps
    assert dataset.observation_space == env.observation_space
    assert_same_episodes(dataset, episodes)
    assert "infos=dict" in repr(next(iter(dataset.iterate_episodes())))  # Minari's own repr

    again = rows_table()
    result = import_minari("cartpole/random-v0", again)
    assert (result.episodes, result.steps, result.items) == (20, table.store.num_steps, table.size)
    ids = np.arange(table.store.next_id)
    for field, column in table.store.read(ids).items():
        np.testing.assert_array_equal(again.store.read(ids)[field], column, err_msg=field)


def test_minari_spaces_are_inferred_when_not_given(tmp_path):
    table = rows_table()
    table.insert(step_rows(cartpole_episodes(3)))
    dataset = export_minari(table, "inferred-v0", root=tmp_path / "elsewhere", **META)
    assert dataset.action_space == gym.spaces.Discrete(2)
    assert dataset.observation_space == gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    assert (tmp_path / "elsewhere" / "inferred-v0").is_dir()
    assert_same_episodes(
        minari.MinariDataset(tmp_path / "elsewhere" / "inferred-v0" / "data"), cartpole_episodes(3)
    )


def test_minari_export_and_import_under_a_relative_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = rows_table()
    table.insert(step_rows(cartpole_episodes(2)))
    dataset = export_minari(table, "relative/root-v0", root="datasets", **META)
    assert dataset.total_episodes == 2
    assert (tmp_path / "datasets" / "relative" / "root-v0" / "data").is_dir()
    result = import_minari("relative/root-v0", rows_table(), root="datasets")
    assert result.episodes == 2


def test_minari_export_leaves_out_episodes_cut_by_the_ring_or_still_running(tmp_path):
    episodes = cartpole_episodes(6, seed=4)
    lengths = [len(e["actions"]) for e in episodes]
    capacity = sum(lengths[1:]) + lengths[0] // 2 + 1  # the first episode's start is lost
    table = rows_table(capacity=capacity)
    for episode in episodes:
        table.insert(step_rows([episode]))
    running = step_rows(cartpole_episodes(1, seed=50))
    table.insert({k: v[:3] for k, v in running.items()})  # no end yet
    assert table.store.oldest_id > 0
    # those three steps overwrote more of the first episodes' steps
    dataset = export_minari(table, "cut-v0", **META)
    whole = [
        e
        for e, first in zip(episodes, np.cumsum([0, *lengths[:-1]]))
        if first >= table.store.oldest_id
    ]
    assert 0 < len(whole) < len(episodes)
    assert_same_episodes(dataset, whole)


def test_minari_export_takes_the_envs_spaces_and_refuses_an_existing_id():
    table = rows_table()
    table.insert(step_rows(cartpole_episodes(3)))
    dataset = export_minari(table, "env-v0", env="CartPole-v1", **META)
    env = gym.make("CartPole-v1")
    assert dataset.observation_space == env.observation_space
    with pytest.raises(DatasetError, match="exists already"):
        export_minari(table, "env-v0", **META)
    assert minari.load_dataset("env-v0").total_episodes == 3


def test_minari_export_of_a_range_starting_after_an_episode_end_keeps_that_episode():
    episodes = cartpole_episodes(5, seed=7)
    table = rows_table()
    table.insert(step_rows(episodes))
    first = len(episodes[0]["actions"]) + len(episodes[1]["actions"])
    end = first + len(episodes[2]["actions"]) + 2  # two steps into episode 3
    dataset = export_minari(table, "range-v0", first_id=first, end_id=end, **META)
    assert_same_episodes(dataset, [episodes[2]])


def test_minari_export_of_a_lanes_store_reads_each_lane_as_one_environment():
    a, b = cartpole_episodes(2, seed=10), cartpole_episodes(2, seed=20)
    ra, rb = step_rows(a), step_rows(b)
    n = min(len(ra["action"]), len(rb["action"]))
    store = StepStore(SIG, capacity=4 * n, lanes=2)
    table = Table("replay", store=store)
    steps = {
        k: np.stack([ra[k][:n], rb[k][:n]], axis=1).reshape(2 * n, *ra[k].shape[1:]) for k in SIG
    }
    table.store.append(steps)
    dataset = export_minari(table, "lanes-v0", **META)
    la = [e for e, end in zip(a, np.cumsum([len(e["actions"]) for e in a])) if end <= n]
    lb = [e for e, end in zip(b, np.cumsum([len(e["actions"]) for e in b])) if end <= n]
    read = list(dataset.iterate_episodes())
    assert len(read) == len(la) + len(lb) >= 2
    got = {tuple(ep.observations[0]) for ep in read}
    assert got == {tuple(e["observations"][0]) for e in la + lb}


def test_minari_export_refusals_write_nothing(minari_root):
    no_flags = Table("t", signature={"obs": ((4,), "float32"), "action": "int64"}, capacity=8)
    no_flags.insert({"obs": np.zeros((3, 4)), "action": np.zeros(3, np.int64)})
    with pytest.raises(DatasetError, match=r"terminated \(column 'terminated'\)") as info:
        export_minari(no_flags, "x-v0", **META)
    assert "fields=" in str(info.value) and "export_npz" in str(info.value)

    interleaved = rows_table()
    a, b = step_rows(cartpole_episodes(1, seed=1)), step_rows(cartpole_episodes(1, seed=2))
    interleaved.insert(
        {k: np.stack([a[k][:5], b[k][:5]], 1).reshape(10, *a[k].shape[1:]) for k in SIG}
    )
    interleaved.insert({k: v[5:] for k, v in a.items()})
    with pytest.raises(DatasetError, match="not one environment's consecutive steps"):
        export_minari(interleaved, "y-v0", **META)

    running = rows_table()
    running.insert({k: v[:-1] for k, v in step_rows(cartpole_episodes(1)).items()})
    with pytest.raises(DatasetError, match="no whole episode"):
        export_minari(running, "z-v0", **META)
    assert not any((minari_root / n).exists() for n in ("x-v0", "y-v0", "z-v0"))


@pytest.mark.parametrize("dataset_id", ["c/r-v0", "no-version", "", None])
def test_minari_export_refuses_a_malformed_dataset_id_before_reading(minari_root, dataset_id):
    table = rows_table()
    table.insert(step_rows(cartpole_episodes(2)))
    with pytest.raises(InvalidArgumentError, match=r"dataset_id=.*namespace/"):
        export_minari(table, dataset_id, **META)
    assert not minari_root.exists() or not any(minari_root.iterdir())


def test_minari_export_of_an_empty_table_or_one_unfinished_row_is_refused(minari_root):
    one_row = rows_table()
    one_row.insert({k: v[:1] for k, v in step_rows(cartpole_episodes(1)).items()})
    for name, table in (("empty-v0", rows_table()), ("one-v0", one_row)):
        with pytest.raises(DatasetError, match="no whole episode"):
            export_minari(table, name, **META)
        assert not (minari_root / name).exists()


def episode_adder_table(max_length: int) -> tuple[Table, EpisodeAdder]:
    sig = EpisodeAdder.signature(obs=((4,), "float32"), action="int64")
    table = Table("episodes", signature=sig, capacity=4000, max_size=200,
                  layout=EpisodeAdder.layout(sig, max_length))  # fmt: skip
    return table, EpisodeAdder(table, max_length=max_length, discount=0.99)


def play_into(adder, episodes: list[dict]) -> None:
    for ep in episodes:
        adder.reset(ep["observations"][0])
        for t in range(len(ep["actions"])):
            adder.add(ep["actions"][t], ep["rewards"][t], ep["observations"][t + 1],
                      ep["terminations"][t], ep["truncations"][t])  # fmt: skip
    adder.flush()


def test_minari_export_of_an_episode_adder_table_reads_one_episode_per_item():
    episodes = cartpole_episodes(12, seed=5)
    table, adder = episode_adder_table(max_length=32)  # episodes of at most 30 steps
    play_into(adder, episodes)
    dataset = export_minari(table, "adder-v0", **META)
    # the adder keeps one flag: a step that both terminated and truncated is terminal
    for ep in episodes:
        ep["truncations"] = ep["truncations"] & ~ep["terminations"]
    assert any(ep["truncations"][-1] for ep in episodes)
    assert_same_episodes(dataset, episodes)
    with pytest.raises(InvalidArgumentError, match="EpisodeAdder table"):
        export_minari(table, "adder-v1", fields={"observation": "obs"}, **META)


def test_minari_round_trip_of_an_episode_adder_table_through_a_new_episode_adder():
    episodes = cartpole_episodes(8, seed=6)
    table, adder = episode_adder_table(max_length=32)
    play_into(adder, episodes)
    dataset = export_minari(table, "adder-round-v0", **META)
    again, again_adder = episode_adder_table(max_length=32)
    result = import_minari(dataset, again_adder)
    assert result.items == table.size == again.size == 8
    ids = np.arange(table.store.next_id)
    assert again.store.next_id == table.store.next_id
    for field, column in table.store.read(ids).items():
        np.testing.assert_array_equal(again.store.read(ids)[field], column, err_msg=field)


def test_minari_export_of_an_episode_adder_table_refuses_items_that_may_split_episodes():
    table, adder = episode_adder_table(max_length=10)
    play_into(adder, cartpole_episodes(3, seed=5))
    with pytest.raises(DatasetError, match="max_length=10 rows"):
        export_minari(table, "split-v0", **META)


def test_minari_export_and_import_with_renamed_and_nested_columns():
    sig = {
        "state": {"pos": ((2,), "float32"), "vel": ((2,), "float32")},
        "act": "int64",
        "reward": "float32",
        "terminated": "bool",
        "truncated": "bool",
        "next_state": {"pos": ((2,), "float32"), "vel": ((2,), "float32")},
    }
    rows = step_rows(cartpole_episodes(4, seed=3))
    split = lambda o: {"pos": o[:, :2], "vel": o[:, 2:]}  # noqa: E731
    data = {
        "state": split(rows["obs"]),
        "act": rows["action"],
        "reward": rows["reward"],
        "terminated": rows["terminated"],
        "truncated": rows["truncated"],
        "next_state": split(rows["next_obs"]),
    }
    fields = {"observation": "state", "action": "act", "next_observation": "next_state"}
    table = Table("nested", signature=sig, capacity=500)
    table.insert(data)
    dataset = export_minari(table, "nested-v0", fields=fields, **META)
    assert isinstance(dataset.observation_space, gym.spaces.Dict)
    first = next(iter(dataset.iterate_episodes()))
    np.testing.assert_array_equal(first.observations["vel"][0], rows["obs"][0, 2:])
    again = Table("nested", signature=sig, capacity=500)
    import_minari(dataset, again, fields=fields)
    ids = np.arange(table.store.next_id)
    for field, column in table.store.read(ids).items():
        np.testing.assert_array_equal(again.store.read(ids)[field], column, err_msg=field)


@pytest.fixture
def cartpole_dataset():
    table = rows_table()
    table.insert(step_rows(cartpole_episodes(20)))
    return export_minari(table, "cartpole/fixture-v0", **META), table


def test_minari_import_through_an_nstep_adder_stores_what_the_env_loop_stores(
    cartpole_dataset,
):
    dataset, _ = cartpole_dataset
    sig = NStepTransitionAdder.signature(obs=((4,), "float32"), action="int64")

    def adder_table() -> tuple[Table, NStepTransitionAdder]:
        table = Table(
            "n", signature=sig, capacity=2000, layout=NStepTransitionAdder.layout(sig, n=3)
        )
        return table, NStepTransitionAdder(table, n=3, discount=0.99)

    imported, adder = adder_table()
    result = import_minari(dataset, adder)
    assert (result.episodes, result.keys) == (20, None)
    direct, live = adder_table()
    for ep in cartpole_episodes(20):  # the same episodes, played as an env loop does
        live.reset(ep["observations"][0])
        for t in range(len(ep["actions"])):
            live.add(
                ep["actions"][t],
                ep["rewards"][t],
                ep["observations"][t + 1],
                ep["terminations"][t],
                ep["truncations"][t],
            )
    live.flush()
    assert imported.size == direct.size == result.items
    ids = np.arange(direct.store.next_id)
    assert imported.store.next_id == direct.store.next_id
    for field, column in direct.store.read(ids).items():
        np.testing.assert_array_equal(imported.store.read(ids)[field], column, err_msg=field)


IMPORT_REFUSALS = {
    "obs shape": (
        Table(
            "r",
            signature={**SIG, "obs": ((5,), "float32"), "next_obs": ((5,), "float32")},
            capacity=2000,
        ),
        SignatureError,
        r"'obs'.*\(4,\), float32.*\(5,\), float32",
    ),
    "obs dtype": (
        Table(
            "r",
            signature={**SIG, "obs": ((4,), "int32"), "next_obs": ((4,), "int32")},
            capacity=2000,
        ),
        SignatureError,
        "'obs'.*float32.*int32.*without changing its kind",
    ),
    "too small": (rows_table(capacity=100), DatasetError, "capacity=100"),
    "not rows": (
        Table(
            "r",
            signature=SIG,
            capacity=2000,
            layout=ItemLayout.sequence(SIG, 2),
        ),
        DatasetError,
        "layout of rows",
    ),
    "extra column": (
        Table("r", signature={**SIG, "discount": "float32"}, capacity=2000),
        DatasetError,
        r"\['discount'\]",
    ),
}


@pytest.mark.parametrize("case", list(IMPORT_REFUSALS))
def test_minari_import_refusals_insert_nothing(cartpole_dataset, case):
    dataset, _ = cartpole_dataset
    table, error, pattern = IMPORT_REFUSALS[case]
    with pytest.raises(error, match=pattern):
        import_minari(dataset, table)
    assert table.store.next_id == 0 and table.size == 0


@pytest.mark.parametrize("priority", [-1.0, float("nan"), "high", [1.0, 2.0]])
def test_minari_import_with_a_bad_priority_appends_no_steps(cartpole_dataset, priority):
    dataset, _ = cartpole_dataset
    table = rows_table()
    with pytest.raises(InvalidArgumentError, match="priority"):
        import_minari(dataset, table, priority=priority)
    assert table.store.next_id == 0 and table.size == 0


def test_minari_import_through_an_adder_of_another_obs_shape_is_refused_first(
    cartpole_dataset,
):
    dataset, _ = cartpole_dataset
    sig = NStepTransitionAdder.signature(obs=((3,), "float32"), action="int64")
    table = Table("n", signature=sig, capacity=500, layout=NStepTransitionAdder.layout(sig, 1))
    adder = NStepTransitionAdder(table, n=1, discount=0.99)
    with pytest.raises(SignatureError, match=r"'obs'.*\(4,\).*\(3,\)"):
        import_minari(dataset, adder)
    with pytest.raises(InvalidArgumentError, match="leave them out"):
        import_minari(dataset, adder, priority=2.0)
    assert table.store.next_id == 0


SPACE_CASES = {
    "floats": (np.zeros((5, 3), np.float32), gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)),
    "scalar ints >= 0": (np.array([0, 3, 1]), gym.spaces.Discrete(4)),
    "negative ints": (
        np.array([-1, 2], np.int32),
        gym.spaces.Box(-(2**31), 2**31 - 1, (), np.int32),
    ),
    "images": (np.zeros((2, 4, 4), np.uint8), gym.spaces.Box(0, 255, (4, 4), np.uint8)),
    "bool vectors": (np.zeros((2, 3), bool), gym.spaces.MultiBinary([3])),
    "scalar bools": (np.zeros(2, bool), gym.spaces.Discrete(2)),
    "nested": (
        {"a": np.zeros((2, 1), np.float64)},
        gym.spaces.Dict({"a": gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)}),
    ),
}


@pytest.mark.parametrize("case", list(SPACE_CASES))
def test_inferred_spaces(case):
    from rlreplay.datasets.episodes import infer_space

    data, space = SPACE_CASES[case]
    assert infer_space(data) == space


def test_minari_import_of_an_unknown_id_names_it_and_what_to_do(minari_root):
    table = rows_table()
    with pytest.raises(DatasetError, match=r"'no/such-dataset-v0'.*minari download") as caught:
        import_minari("no/such-dataset-v0", table, root=minari_root)
    assert str(minari_root) in str(caught.value)
    assert table.store.next_id == 0
