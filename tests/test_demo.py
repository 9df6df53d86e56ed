"""`rlreplay demo`: a real training run of an example agent, or a clear install hint."""

from __future__ import annotations

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
    assert summary["env_steps"] >= 600
    assert (out / "metrics.csv").exists()
