"""The example server configuration builds the tables it describes."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("zmq")  # rlreplay.net needs the net extra

from rlreplay.errors import InvalidArgumentError
from rlreplay.net.server.config import load_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tables.toml"


def test_example_tables_toml_builds_a_shared_store_and_a_queue():
    tables = {t.name: t for t in load_config(EXAMPLE)}
    assert set(tables) == {"replay", "rows"}
    assert tables["replay"].layout.span == 2 and tables["replay"].store.capacity == 100_000
    assert tables["rows"].max_times_sampled == 1


def test_the_example_config_is_installed_with_the_package_and_named_when_a_config_is_missing():
    from rlreplay.errors import InvalidArgumentError
    from rlreplay.net.server.config import EXAMPLE_CONFIG

    assert {t.name for t in load_config(EXAMPLE_CONFIG)} == {"replay", "rows"}
    with pytest.raises(InvalidArgumentError, match=r"tables\.toml is one"):
        load_config(Path("no") / "such.toml")


@pytest.mark.parametrize("script", ["dqn_cartpole", "sac_continuous", "ppo_cartpole", "apex_dqn"])
def test_each_example_prints_its_help_and_refuses_a_bad_flag_in_one_line(script):
    path = Path(__file__).resolve().parents[1] / "examples" / f"{script}.py"
    shown = subprocess.run(
        [sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    first = " ".join(shown.stdout.split("\n\n")[1].split())  # the description
    assert first.endswith((".", ")")), first  # its whole first paragraph, not a cut line
    refused = subprocess.run(
        [sys.executable, str(path), "--seed", "1", "--eval-episodes", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].endswith("must be an int >= 1")
    assert "Traceback" not in refused.stderr


# (example, flags, what the one-line refusal says): flags the run would otherwise refuse
# late, or with a traceback from the runtime
LATE_REFUSALS = [
    ("dqn_cartpole", ["--batch-size", "0"], "--batch-size=0 must be an int >= 1"),
    ("dqn_cartpole", ["--updates-per-env-step", "0"], "must be a number > 0"),
    ("dqn_cartpole", ["--learning-starts", "0"], "--learning-starts=0 must be an int >= 1"),
    ("dqn_cartpole", ["--weight-sync-period", "0"], "--weight-sync-period=0 must be"),
    ("dqn_cartpole", ["--publish-every", "0"], "--publish-every=0 must be an int >= 1"),
    ("dqn_cartpole", ["--seed", "-1"], "--seed=-1 must be an int >= 0"),
    ("dqn_cartpole", ["--batch-size", "100000"], "must be at most --buffer-size=50000"),
    ("dqn_cartpole", ["--learning-starts", "60000"],
     "--learning-starts=60000 must be at most --buffer-size=50000"),
    ("sac_continuous", ["--batch-size", "0"], "--batch-size=0 must be an int >= 1"),
    ("sac_continuous", ["--updates-per-env-step", "0"], "must be a number > 0"),
    ("sac_continuous", ["--weight-sync-period", "0"], "--weight-sync-period=0 must be"),
    ("ppo_cartpole", ["--num-minibatches", "1000"], "must be at most --num-envs x --num-steps"),
]


@pytest.mark.parametrize(
    ("script", "argv", "said"), LATE_REFUSALS,
    ids=[f"{s}{'-'.join(a)}" for s, a, _ in LATE_REFUSALS],
)
def test_flags_the_run_cannot_use_are_refused_before_it_starts(script, argv, said):
    module = importlib.import_module(f"rlreplay.examples.{script}")
    with pytest.raises(InvalidArgumentError) as info:
        args = module.parse_args(argv)
        getattr(module, "check_args", lambda a: None)(args)
    assert str(info.value).startswith("--") and said in str(info.value)
