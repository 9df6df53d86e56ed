"""Training-script helpers: flags from a dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from rlreplay.errors import InvalidArgumentError
from rlreplay.runtime.flags import check_ranges, flag, parse_flags


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


@pytest.mark.parametrize("argv", [["--total"], ["--backend", "dask"], ["--total-steps", "x"],
                                  ["--nope", "1"]],
                         ids=["abbreviation", "unknown-backend", "wrong-type", "unknown-flag"])
def test_mistyped_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parse_flags(Knobs, argv)
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [("total_steps", 0, "--total-steps=0 must be an int >= 1"),
     ("total_steps", True, "--total-steps=True must be an int >= 1"),
     ("lr", float("inf"), "--lr=inf must be a number > 0"),
     ("gamma", 1.5, "--gamma=1.5 must be in [0, 1]"),
     ("tau", 0.0, "--tau=0.0 must be in (0, 1]")],
    ids=["zero-count", "bool-count", "infinite-rate", "gamma-above-one", "zero-tau"],
)
def test_check_ranges_names_the_flag_out_of_range(field, value, said):
    args = SimpleNamespace(total_steps=10, lr=1e-3, gamma=0.99, tau=0.005)
    setattr(args, field, value)
    with pytest.raises(InvalidArgumentError) as info:
        check_ranges(args, counts=("total_steps",), positive=("lr",), fractions=("gamma",),
                     open_fractions=("tau",))
    assert said in str(info.value)


def test_check_ranges_accepts_the_bounds():
    args = SimpleNamespace(n=1, lr=1e-9, gamma=0.0, tau=1.0)
    check_ranges(args, counts=("n",), positive=("lr",), fractions=("gamma",),
                 open_fractions=("tau",))


def test_help_shows_each_fields_docstring_and_default(capsys):
    with pytest.raises(SystemExit):
        parse_flags(Documented, ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--total-steps TOTAL_STEPS env steps to train for (default: 100)" in text


@dataclass
class Documented:
    total_steps: int = 100
    """env steps to train for"""


def test_help_ends_with_the_epilog(capsys):
    with pytest.raises(SystemExit):
        parse_flags(Documented, ["--help"], "what it trains", epilog="--extra N: parsed apart")
    out = capsys.readouterr().out
    assert out.split("\n", 2)[2].startswith("what it trains")
    assert out.rstrip().endswith("--extra N: parsed apart")


def test_run_script_ends_a_refused_flag_in_one_line_and_keeps_other_failures_whole(capsys):
    from rlreplay.errors import InvalidArgumentError, SignatureError
    from rlreplay.runtime.flags import run_script

    def refused_flag():
        raise InvalidArgumentError("--lr=-1 must be a finite number > 0")

    with pytest.raises(SystemExit) as ended:
        run_script(refused_flag)
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip().endswith("error: --lr=-1 must be a finite number > 0")

    def failed_mid_run():
        raise SignatureError("rows['obs'] has shape (3,); expected (4,)")

    with pytest.raises(SignatureError):  # not hidden behind one line
        run_script(failed_mid_run)
    run_script(lambda: {"ok": 1})
    assert '"ok": 1' in capsys.readouterr().out
