"""Ordinary mistakes on the ``rlreplay`` command line are answered in one line that says
what to do, before anything is printed or served.

Subprocesses bounded by a timeout, as in ``test_cli.py``; servers bind 127.0.0.1 only.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from test_cli import ENV, ROOT, TABLE, cli, one_line_error

from rlreplay.cli import build_parser
from rlreplay.cli.parsing import size_bytes


@pytest.fixture
def config(tmp_path) -> str:
    path = tmp_path / "tables.toml"
    path.write_text(TABLE)
    return str(path)


def top_level_error(result: subprocess.CompletedProcess) -> str:
    """The one stderr line of a usage error of ``rlreplay`` itself (exit status 2)."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("rlreplay: error: "), line
    return line


def test_a_misspelt_option_is_named_not_taken_for_a_missing_command():
    line = top_level_error(cli("--versoin"))
    assert "unrecognized arguments: --versoin" in line and "required" not in line
    assert "required: COMMAND" in top_level_error(cli())


def test_info_build_with_an_address_fails_before_printing_anything():
    result = cli("info", "--build", "extra")
    line = one_line_error(result, 2)
    assert result.stdout == "" and "--build takes no ADDRESS" in line and "'extra'" in line


# ------------------------------------------------------------------- --bind
@pytest.mark.parametrize("bind", ["localhost:8000", "tcp://127.0.0.1:8001"])
@pytest.mark.parametrize("insecure", [[], ["--insecure"]])
def test_bind_with_a_port_says_to_give_the_port_with_port(config, bind, insecure):
    line = one_line_error(cli("serve", "--config", config, "--bind", bind, *insecure), 2)
    assert "--bind takes a host (or ipc:///path); give the port with --port" in line
    assert "loopback" not in line and "WITHOUT" not in line  # one line: no warning logged


# ------------------------------------------------------------ sizes, numbers
@pytest.mark.parametrize(
    ("text", "size"),
    [("1GiB", 1 << 30), ("512MiB", 512 << 20), ("64kib", 64 << 10), ("1048576", 1 << 20),
     ("1.5GiB", 3 << 29), ("2GB", 2 * 10**9)],
)  # fmt: skip
def test_size_flags_take_bytes_or_a_unit(text, size):
    assert size_bytes(text) == size
    args = build_parser().parse_args(["serve", "--config", "x", "--max-unread-bytes", text])
    assert args.max_unread_bytes == size


@pytest.mark.parametrize(
    ("text", "why"),
    [("1GB5", "is not a size"), ("12 parsecs", "is not a size"), ("0", "at least 1"),
     ("0.5B", "whole number of bytes"), ("-1", "is not a size")],
)  # fmt: skip
def test_a_size_flag_refuses_what_is_not_a_size(config, text, why):
    line = one_line_error(cli("serve", "--config", config, "--max-message-bytes", text), 2)
    assert "--max-message-bytes" in line and why in line


@pytest.mark.parametrize(
    ("args", "said"),
    [(["serve", "--config", "x", "--max-parked-per-client", "x"], "'x' is not an integer"),
     (["serve", "--config", "x", "--max-writers-per-client", "x"], "'x' is not an integer"),
     (["demo", "--total-steps", "soon"], "'soon' is not an integer")],
)  # fmt: skip
def test_a_number_flag_names_what_it_takes(args, said):
    assert said in one_line_error(cli(*args), 2)


# ---------------------------------------------------------------- key files
@pytest.mark.parametrize(
    ("args", "flag"),
    [(["serve", "--config", "CONFIG", "--curve-secret", "nope.key_secret"], "--curve-secret"),
     (["info", "127.0.0.1:1", "--server-key", "nope.key"], "--server-key"),
     (["info", "127.0.0.1:1", "--server-key", "nope.key", "--client-key", "."], "--server-key")],
)  # fmt: skip
def test_a_missing_key_file_is_said_not_to_exist(config, tmp_path, args, flag):
    args = [config if a == "CONFIG" else a for a in args]
    line = one_line_error(cli(*args, cwd=tmp_path), 2)
    assert f"{flag} nope.key" in line and "does not exist" in line and "keygen" in line


# ------------------------------------------------------------------ extras
def test_metrics_port_without_prometheus_client_says_what_to_install(config):
    code = (
        "import sys; sys.modules['prometheus_client'] = None; from rlreplay.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "serve", "--config", config, "--metrics-port", "9100"],
        capture_output=True,
        text=True,
        timeout=30,
        env=ENV,
    )
    line = one_line_error(result, 2)
    assert "--metrics-port" in line and 'pip install "rlreplay[metrics]"' in line


def test_the_adder_benchmark_prints_its_help_instead_of_running():
    script = Path(ROOT) / "benchmarks" / "bench_adders.py"
    result = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:") and "--env-steps" in result.stdout
    assert "steps/s" not in result.stdout
