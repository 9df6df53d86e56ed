"""The ``rlreplay`` command line, run for real: user errors are one line, never a traceback.

Every case runs ``python -m rlreplay.cli`` in a subprocess (bounded by a timeout) against
real servers on 127.0.0.1, and checks the exit status (2: the command cannot run as given,
1: the server failed) and the one line on stderr.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

import rlreplay
from rlreplay.net.wire.auth import keygen

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
ENV.pop("RLREPLAY_NO_EXTENSION", None)
TABLE = (
    "[[table]]\nname = 't'\nmax_size = 10\n"
    "signature = { obs = { shape = [3], dtype = 'float32' } }\n"
)


def cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 30.0):
    """Run ``rlreplay ARGS`` in a subprocess; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "rlreplay.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or ENV,
        cwd=cwd,
    )


def one_line_error(result: subprocess.CompletedProcess, code: int) -> str:
    """Assert ``result`` failed with ``code`` and one stderr line and no traceback."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("rlreplay "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    for name in ("server", "client", "stranger"):
        keygen(folder, name)
    (folder / "authorized").mkdir()
    shutil.copy(folder / "client.key", folder / "authorized" / "client.key")
    return folder


def small_table() -> rlreplay.Table:
    return rlreplay.Table("t", signature={"obs": ((3,), "float32")}, max_size=10)


@pytest.fixture(scope="module")
def plain_server():
    with rlreplay.Server([small_table()]) as server:
        yield server.address


@pytest.fixture(scope="module")
def curve_server(keys):
    server = rlreplay.Server(
        [small_table()],
        curve_secret_key=str(keys / "server.key_secret"),
        authorized_keys=str(keys / "authorized"),
    )
    with server:
        yield server.address


# ------------------------------------------------------------- the parser
def test_version_prints_the_package_version():
    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"rlreplay {rlreplay.__version__}"
    # one version: rlreplay/version.py's (which checkpoint manifests record) is the
    # installed distribution's, from pyproject.toml
    assert rlreplay.__version__ == importlib.metadata.version("rlreplay")


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("serve", "(default: 127.0.0.1)"),
        ("demo", "(default: dqn)"),
        ("info", "(default: 5.0)"),
        ("keygen", "(default: server)"),
    ],
)
def test_help_shows_the_defaults(command, shown):
    result = cli(command, "--help")
    assert result.returncode == 0 and shown in " ".join(result.stdout.split())
    assert "(default: None)" not in result.stdout


def test_a_bad_argument_is_one_line_with_exit_status_2():
    line = one_line_error(cli("demo", "--total-steps", "-1"), 2)
    assert "--total-steps" in line and "--help" in line


# ------------------------------------------------------------------- serve
CONFIG_ERRORS = {
    "missing_file": (None, ["does not exist", "nope.toml"]),
    "toml_syntax_error": ("[[table]]\nname = 't' x\n", ["not valid TOML", "line 2"]),
    "single_bracket_table": ("[table]\nname = 't'\n", ["[table] must be written [[table]]"]),
    "two_single_bracket_tables": (
        "[table]\nname = 'a'\n\n[table]\nname = 'b'\n",
        ["not valid TOML", "line 4", "[table] must be written [[table]]"],
    ),
    "unknown_key": (TABLE + "max_sise = 3\n", ["table[0] 't'", "max_sise"]),
    "queue_without_size": (TABLE + "kind = 'queue'\n", ["table[0] 't'", "size"]),
    "store_too_large_for_memory": (
        "[[table]]\nname = 't'\nmax_size = 2_000_000_000\n"
        "signature = { obs = { shape = [1_000_000], dtype = 'float64' } }\n",
        ["table[0] 't'", "needs 14551.92 TiB", "available", "lower capacity"],
    ),
    "queue_with_a_sampler": (
        TABLE.replace("max_size = 10\n", "")
        + "kind = 'queue'\nsize = 4\nsampler = { type = 'Uniform' }\n",
        ["table[0] 't'", "['sampler']", "leave them out"],
    ),
    "shape_not_a_list": (
        TABLE.replace("shape = [3]", "shape = 3"),
        ["table[0] 't'", "shape=3", "must be a list"],
    ),
    "size_on_a_table": (TABLE + "size = 4\n", ["table[0] 't'", "max_size"]),
    "bad_limiter_argument": (
        TABLE + "rate_limiter = { type = 'MinSize', size = 3 }\n",
        ["table[0] 't'", "unknown keys ['size']", "it takes ['min_size_to_sample']"],
    ),
    "bad_selector_argument": (
        TABLE + "sampler = { type = 'Prioritized', alpha = 0.6 }\n",
        ["table[0] 't'", "unknown keys ['alpha']", "it takes ['priority_exponent']"],
    ),
    "limiter_named_not_described": (
        TABLE + "rate_limiter = 'MinSize'\n",
        ["table[0] 't'", "must be a table such as", "min_size_to_sample"],
    ),
}


@pytest.mark.parametrize("case", sorted(CONFIG_ERRORS))
def test_serve_answers_a_configuration_mistake_in_one_line(tmp_path, case):
    text, expected = CONFIG_ERRORS[case]
    path = tmp_path / "nope.toml"
    if text is not None:
        path.write_text(text)
    line = one_line_error(cli("serve", "--config", str(path), timeout=30.0), 2)
    for fragment in expected:
        assert fragment in line, line


def test_a_queue_in_a_config_keeps_its_layout():
    from rlreplay.net.server.config import tables_from_config

    signature = {"obs": {"shape": [3], "dtype": "float32"}}
    entry = {"name": "q", "kind": "queue", "size": 4, "signature": signature}
    entry["layout"] = {"type": "sequence", "length": 3}
    (queue,) = tables_from_config({"table": [entry]})
    assert queue.layout.span == 3 and queue.max_times_sampled == 1


def test_serve_on_a_port_in_use_says_so_and_how_to_choose_another(tmp_path):
    config = tmp_path / "tables.toml"
    config.write_text(TABLE)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        line = one_line_error(cli("serve", "--config", str(config), "--port", port), 2)
    assert "already in use" in line and "--port" in line


def test_serve_refuses_a_public_bind_naming_the_command_line_flags(tmp_path):
    config = tmp_path / "tables.toml"
    config.write_text(TABLE)
    line = one_line_error(cli("serve", "--config", str(config), "--bind", "0.0.0.0"), 2)
    assert "--curve-secret" in line and "--insecure" in line
    assert "curve_secret_key" not in line and "insecure=True" not in line


def test_authorized_keys_without_curve_are_refused(tmp_path):
    config = tmp_path / "tables.toml"
    config.write_text(TABLE)
    line = one_line_error(cli("serve", "--config", str(config), "--authorized-keys", "."), 2)
    assert "--curve-secret" in line


BLOCK_NET = (
    "import sys; sys.modules['zmq'] = None; from rlreplay.cli import main; "
    "sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize(
    "args", [["serve", "--config", "x.toml"], ["info", "127.0.0.1:1"], ["keygen", "k"]]
)
def test_commands_without_the_net_extra_say_what_to_install(tmp_path, args):
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_NET, *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=ENV,
        cwd=tmp_path,
    )
    line = one_line_error(result, 2)
    assert 'pip install "rlreplay[net]"' in line and "zmq" in line


def test_info_build_and_demo_need_no_net_extra(tmp_path):
    for args in (["info", "--build"], ["demo", "--help"]):
        result = subprocess.run(
            [sys.executable, "-c", BLOCK_NET, *args],
            capture_output=True,
            text=True,
            timeout=30,
            env=ENV,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr


# -------------------------------------------------------------------- info
def test_info_without_a_table_name_prints_every_table(plain_server):
    result = cli("info", plain_server)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:2] == ["table", "size"] and "\nt " in result.stdout


def test_info_with_an_unknown_table_name_lists_the_served_ones(plain_server):
    line = one_line_error(cli("info", plain_server, "nope"), 2)
    assert "'nope'" in line and "['t']" in line


def test_info_on_a_dead_address_says_nothing_is_listening():
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    line = one_line_error(cli("info", f"tcp://127.0.0.1:{port}", "--timeout", "0.5"), 1)
    assert "nothing accepts connections" in line


CREDENTIALS = {
    "no_keys": ([], ["uses CURVE", "no credentials", "--server-key"]),
    "wrong_server_key": (
        ["--server-key", "stranger.key", "--client-key", "client.key_secret"],
        ["--server-key is not this server's public key"],
    ),
    "unauthorized_client_key": (
        ["--server-key", "server.key", "--client-key", "stranger.key_secret"],
        ["does not accept this client's key", "--authorized-keys"],
    ),
}


@pytest.mark.parametrize("case", sorted(CREDENTIALS))
def test_info_on_a_curve_server_says_which_credential_is_wrong(keys, curve_server, case):
    args, expected = CREDENTIALS[case]
    result = cli("info", curve_server, *args, "--timeout", "0.5", cwd=keys)
    line = one_line_error(result, 1)
    for fragment in expected:
        assert fragment in line, line


def test_info_on_a_curve_server_with_the_right_keys_prints_its_tables(keys, curve_server):
    args = ["--server-key", "server.key", "--client-key", "client.key_secret"]
    result = cli("info", curve_server, *args, cwd=keys)
    assert result.returncode == 0, result.stderr
    assert "\nt " in result.stdout


def test_info_with_keys_on_a_server_without_curve_says_to_leave_them_out(keys, plain_server):
    result = cli("info", plain_server, "--server-key", "server.key", "--timeout", "0.5", cwd=keys)
    assert "does not use CURVE" in one_line_error(result, 1)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("tcp://localhost", "no :PORT"),
        ("tcp://local host:80", "whitespace"),
        ("tcp://:80", "no host name"),
        ("localhost:http", "the port must be a number"),
        ("ipc://", "no socket path"),
    ],
)
def test_info_on_a_malformed_address_says_what_is_wrong(address, why):
    line = one_line_error(cli("info", address), 2)
    assert repr(address if "://" in address else "tcp://" + address) in line and why in line


def test_info_needs_an_address_or_build():
    assert "ADDRESS" in one_line_error(cli("info"), 2)


def test_a_reader_that_leaves_early_gets_no_traceback():
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlreplay.cli", "info", "--build"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    proc.stdout.close()  # before the command can print: its writes fail with EPIPE
    try:
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 1 and stderr == b"", stderr.decode()


@pytest.mark.parametrize(
    ("disable", "reason"),
    [("", "active"), ("1", "disabled by RLREPLAY_NO_EXTENSION=1")],
)
def test_info_build_lists_every_kernel_and_why_it_is_not_active(disable, reason):
    from rlreplay.core._compiled import KERNELS, kernel_status

    if not disable and not all(s.active for s in kernel_status()):
        pytest.skip("the compiled kernels are not built here")
    result = cli("info", "--build", env={**ENV, "RLREPLAY_NO_EXTENSION": disable})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"rlreplay {rlreplay.__version__} (Python ")
    for kernel in KERNELS:
        (row,) = [ln for ln in lines if ln.startswith(kernel + " ")]
        assert row.split()[1] == ("no" if disable else "yes") and reason in row


# ------------------------------------------------------------------ keygen
def test_keygen_writes_a_pair_and_never_overwrites_it(tmp_path):
    first = cli("keygen", "keys", "--name", "client", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    secret = tmp_path / "keys" / "client.key_secret"
    before = secret.read_bytes()
    assert (tmp_path / "keys" / "client.key").exists() and os.stat(secret).st_mode & 0o077 == 0
    line = one_line_error(cli("keygen", "keys", "--name", "client", cwd=tmp_path), 2)
    assert "never overwritten" in line and secret.read_bytes() == before
    (tmp_path / "a_file").write_text("")
    line = one_line_error(cli("keygen", "a_file", cwd=tmp_path), 2)
    assert "cannot write keys to the folder 'a_file'" in line


def test_kernel_status_says_a_kernel_that_is_absent_was_not_built(monkeypatch):
    from rlreplay.core._compiled import kernel_status

    monkeypatch.delenv("RLREPLAY_NO_EXTENSION", raising=False)

    (status,) = kernel_status(["rlreplay.core._kernel_never_built"])
    assert not status.active and status.path is None
    assert status.reason.startswith("not built: no C compiler at install")


def test_kernel_status_gives_the_import_error_of_a_kernel_that_fails_to_load(tmp_path, monkeypatch):
    from rlreplay.core._compiled import kernel_status

    (tmp_path / "rlreplay_broken_kernel.py").write_text(
        "raise ImportError('undefined symbol: rr_gather_rows')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("RLREPLAY_NO_EXTENSION", raising=False)
    (status,) = kernel_status(["rlreplay_broken_kernel"])
    assert not status.active and status.path == str(tmp_path / "rlreplay_broken_kernel.py")
    assert status.reason == "import error: undefined symbol: rr_gather_rows"


def test_the_build_report_lists_every_extension_setup_builds():
    from rlreplay.core._compiled import KERNELS

    built = re.findall(r'Extension\(\s*"([\w.]+)"', (ROOT / "setup.py").read_text())
    assert sorted(built) == sorted(KERNELS)


def test_the_command_logs_rlreplay_at_info_and_other_libraries_only_from_warning():
    code = (
        "import logging\n"
        "from rlreplay import cli\n"
        "cli.main(['info', '--build'])\n"
        "logging.getLogger('matplotlib.font_manager').info('another library at info')\n"
        "logging.getLogger('matplotlib').warning('another library warns')\n"
        "logging.getLogger('rlreplay.runtime').info('rlreplay at info')\n"
        "logging.getLogger('rlreplay.runtime').debug('rlreplay at debug')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "rlreplay at info" in result.stderr and "another library warns" in result.stderr
    assert "another library at info" not in result.stderr
    assert "rlreplay at debug" not in result.stderr
