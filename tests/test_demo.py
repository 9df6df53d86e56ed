"""`rlreplay demo`: a real training run of an example agent, or a clear install hint."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys

import pytest

import rlreplay.demo as demo
from rlreplay.errors import InvalidArgumentError


def test_demo_refuses_an_unknown_agent_naming_the_choices():
    with pytest.raises(InvalidArgumentError, match=r"agent='dqn2'.*apex"):
        demo.run_demo("dqn2")


def test_demo_without_torch_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(demo, "NEEDS", ("torch", "no_such_module_rlreplay"))
    with pytest.raises(InvalidArgumentError, match=r'pip install "rlreplay\[examples\]"'):
        demo.run_demo("dqn")


def test_every_demo_agent_is_an_installed_example_with_a_main():
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    import importlib

    for module, _ in demo.AGENTS.values():
        assert callable(importlib.import_module(f"rlreplay.examples.{module}").main)


def test_demo_trains_from_the_command_line(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "rlreplay.cli", "demo", "--total-steps", "600",
         "--out", str(out)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "done:" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    # whether the run reached its target is said, not left to the summary file
    assert f"(target {summary['target']:g}: not reached" in result.stdout
    assert summary["env_steps"] >= 600
    assert (out / "metrics.csv").exists()
    # 600 steps are fewer than DQN's learning_starts: the run says so
    assert summary["updates"] == 0 and "warning: no gradient update ran" in result.stdout


def test_demo_refuses_an_out_folder_it_cannot_write_before_training(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "rlreplay.cli", "demo", "--out", str(blocker / "run")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--out=" in result.stderr and "cannot hold the run's files" in result.stderr
    assert "done:" not in result.stdout


@pytest.mark.parametrize("agent", ["dqn", "sac", "ppo"])
def test_every_agent_writes_its_files_to_its_default_folder(tmp_path, monkeypatch, agent):
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    monkeypatch.chdir(tmp_path)
    demo.run_demo(agent, total_steps=300, backend="inline")
    out = tmp_path / demo.default_out(agent)
    written = {p.name for p in out.iterdir()} if out.is_dir() else set()
    assert {"metrics.csv", "summary.json"} <= written
    if importlib.util.find_spec("matplotlib") is not None:
        assert "learning_curve.png" in written


def test_every_example_writes_to_the_demos_default_folder_without_out():
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    for agent, (module, _) in demo.AGENTS.items():
        example = importlib.import_module(f"rlreplay.examples.{module}")
        args = getattr(example, "ApexArgs", None) or example.Args
        assert args().out == demo.default_out(agent) == f"runs/{module}", agent


def test_getting_started_names_the_demos_default_backend():
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "getting_started.md").read_text()
    section = " ".join(text.split("## The demo", 1)[1].split("##", 1)[0].split())
    example = importlib.import_module(f"rlreplay.examples.{demo.AGENTS['dqn'][0]}")
    assert f"the {example.Args().backend} backend" in section


def test_the_demos_last_line_says_where_its_files_are(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    result = subprocess.run(
        [sys.executable, "-m", "rlreplay.cli", "demo", "--agent", "ppo", "--backend",
         "inline", "--total-steps", "300"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    folder = (tmp_path / "runs" / "ppo_cartpole").resolve()
    assert (folder / "summary.json").exists() and (folder / "metrics.csv").exists()
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(f"files in {folder}: metrics.csv, summary.json"), last


def test_a_demo_told_to_write_nothing_says_so(tmp_path):
    assert demo.written("") == "no files written (--out '')"
    assert demo.written(str(tmp_path)) == f"files in {tmp_path.resolve()}: none"


@pytest.mark.parametrize("backend", ["inline", "threads", "processes", "ray"])
def test_the_demo_takes_every_backend_the_runtime_has(backend):
    from rlreplay.cli import build_parser
    from rlreplay.runtime.config import BACKENDS

    assert backend in BACKENDS
    args = build_parser().parse_args(["demo", "--backend", backend])
    assert args.backend == backend
