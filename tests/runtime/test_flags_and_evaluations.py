"""Training-script helpers: flags from a dataclass, evaluations at fixed env steps."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from rlreplay.errors import InvalidArgumentError
from rlreplay.runtime.flags import flag, parse_flags
from rlreplay.runtime.report import Evaluations


@dataclass
class Knobs:
    total_steps: int = 100
    lr: float = 1e-3
    backend: str = "threads"
    progress: bool = True
    out: str = "runs/x"


def test_every_field_is_a_flag_of_its_defaults_type():
    knobs = parse_flags(Knobs, ["--total-steps", "7", "--lr", "0.5", "--no-progress",
                                "--backend", "inline", "--out", ""])
    assert knobs == Knobs(total_steps=7, lr=0.5, backend="inline", progress=False, out="")
    assert parse_flags(Knobs, []) == Knobs()
    assert flag("total_steps") == "--total-steps"


@pytest.mark.parametrize("argv", [["--total"], ["--backend", "ray"], ["--total-steps", "x"],
                                  ["--nope", "1"]],
                         ids=["abbreviation", "unknown-backend", "wrong-type", "unknown-flag"])
def test_mistyped_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parse_flags(Knobs, argv)
    assert "error" in capsys.readouterr().err


def test_evaluations_run_every_n_steps_and_on_the_final_row():
    calls = []
    hook = Evaluations(lambda params: calls.append(params["w"]) or 1.0, every=1_000)
    weights = SimpleNamespace(params={"w": 3}, version=7)
    rows = [(500, False), (1_000, False), (1_200, False), (3_100, False), (3_200, True)]
    out = [hook({"env_steps": s, "final": f}, weights)["eval_return"] for s, f in rows]
    assert out == [None, 1.0, None, 1.0, 1.0]
    assert hook({"env_steps": 5_000}, None) == {"eval_return": None, "eval_version": None}


def test_evaluations_refuse_bad_arguments():
    with pytest.raises(InvalidArgumentError, match="every=0"):
        Evaluations(lambda p: 0.0, every=0)
    with pytest.raises(InvalidArgumentError, match="evaluate_params"):
        Evaluations("greedy", every=10)
