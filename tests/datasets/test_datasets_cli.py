"""``rlreplay export``: a checkpoint's tables written as datasets from the command line."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from rlreplay import ItemLayout, StepStore, Table
from rlreplay.checkpoint import save
from rlreplay.cli import main
from rlreplay.datasets.npz import import_npz

SIG = {
    "obs": ((2,), "float32"),
    "action": "int64",
    "reward": "float32",
    "terminated": "bool",
    "truncated": "bool",
    "next_obs": ((2,), "float32"),
}


def episodes_rows(n_episodes: int = 5, length: int = 7) -> dict[str, np.ndarray]:
    """Step rows of ``n_episodes`` episodes of ``length`` steps (obs counts the steps)."""
    n = n_episodes * length
    obs = np.arange(2 * (n + 1), dtype=np.float32).reshape(n + 1, 2)
    ends = (np.arange(n) % length) == length - 1
    next_obs = obs[1:].copy()
    return {
        "obs": obs[:-1],
        "action": np.arange(n) % 3,
        "reward": np.ones(n),
        "terminated": ends,
        "truncated": np.zeros(n, bool),
        "next_obs": next_obs,
    }


@pytest.fixture
def checkpoint(tmp_path):
    store = StepStore(SIG, capacity=100)
    rows = Table("rows", store=store, seed=0)
    # "then_obs": the stored field next_obs keeps its name
    pairs_layout = ItemLayout.transition(SIG, "obs", next_prefix="then_")
    pairs = Table("pairs", store=store, layout=pairs_layout, seed=1)
    rows.insert(episodes_rows())
    pairs.create_items(np.arange(0, 30, 2))
    save([rows, pairs], tmp_path / "ckpts")
    return tmp_path / "ckpts", rows, pairs


def test_export_npz_writes_every_table_of_the_newest_checkpoint(checkpoint, tmp_path, capsys):
    folder, rows, pairs = checkpoint
    out = tmp_path / "replay.npz"
    assert main(["export", str(folder), "--npz", str(out)]) == 0
    assert "rows: 35 items" in capsys.readouterr().out
    store = StepStore(SIG, capacity=100)
    copies = [Table("rows", store=store), Table("pairs", store=store, layout=pairs.layout)]
    keys = import_npz(out, copies)
    assert (len(keys["rows"]), len(keys["pairs"])) == (35, 15)
    ids = np.arange(35)
    for field, column in rows.store.read(ids).items():
        np.testing.assert_array_equal(store.read(ids)[field], column)


def test_export_minari_writes_the_episodes_of_a_tables_rows(checkpoint, tmp_path, capsys):
    minari = pytest.importorskip("minari")
    pytest.importorskip("h5py")
    folder, _, _ = checkpoint
    root = tmp_path / "minari"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari's advice on missing metadata
        code = main(
            ["export", str(folder), "--minari", "steps-v0", "--tables", "rows",
             "--minari-root", str(root), "--end-id", "21"]
        )  # fmt: skip
    assert code == 0
    assert "3 episodes, 21 steps" in capsys.readouterr().out
    dataset = minari.MinariDataset(root / "steps-v0" / "data")
    first = next(iter(dataset.iterate_episodes()))
    np.testing.assert_array_equal(first.observations, np.arange(16.0).reshape(8, 2))


def test_export_of_a_missing_checkpoint_is_a_usage_error(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nowhere"), "--npz", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlreplay export: error:") and "nowhere' does not exist" in err
    assert not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--npz", "x.npz", "--tables", "nope"], "names ['nope']; the checkpoint holds"),
        (["--npz", "x.npz", "--field", "action=a"], "--field and --minari-root go with"),
        (["--minari", "m-v0", "--item-data"], "--item-data goes with --npz"),
        (["--minari", "m-v0", "--tables", "rows,pairs"], "name one table"),
        (["--npz", "no/such/x.npz"], "the folder 'no/such' does not exist"),
    ],
)
def test_export_mistakes_are_one_line_and_write_nothing(checkpoint, tmp_path, capsys, args,
                                                       message, monkeypatch):  # fmt: skip
    folder, _, _ = checkpoint
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(folder), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlreplay export: error:") and message in err, err
    assert not (tmp_path / "x.npz").exists()
