"""The demo: actor and learner threads held at the chosen ratio by the table alone."""

import subprocess
import sys

import pytest

from rlreplay.demo import run_demo
from rlreplay.errors import InvalidArgumentError


def test_demo_holds_the_samples_per_insert_ratio_within_the_error_buffer():
    lines: list[str] = []
    spi, batch = 8.0, 32
    info = run_demo(seconds=2.0, samples_per_insert=spi, batch_size=batch, print_fn=lines.append)
    assert info["inserts"] > 4 * batch and info["samples"] > 0
    offset = spi * 4 * batch  # min_size_to_sample * samples_per_insert
    diff = info["inserts"] * spi - info["samples"]
    error_buffer = 4 * batch
    assert offset - error_buffer - batch <= diff <= offset + error_buffer + spi
    assert any(line.startswith("done:") for line in lines)


def test_demo_runs_from_the_command_line():
    out = subprocess.run(
        [sys.executable, "-m", "rlreplay.cli", "demo", "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "inserts/s" in out.stdout and "done:" in out.stdout


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"seconds": 0}, id="zero_seconds"),
        pytest.param({"samples_per_insert": -1.0}, id="negative_ratio"),
        pytest.param({"batch_size": 2.5}, id="float_batch_size"),
        pytest.param({"batch_size": 64, "capacity": 256}, id="capacity_below_min_size"),
    ],
)
def test_demo_refuses_arguments_it_cannot_run_with_before_starting(kwargs):
    lines: list[str] = []
    with pytest.raises(InvalidArgumentError):
        run_demo(print_fn=lines.append, **kwargs)
    assert lines == []
