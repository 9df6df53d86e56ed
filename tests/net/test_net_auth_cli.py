"""CURVE authentication, and ``rlreplay serve`` run until a signal stops it.

(The command line's errors are checked in ``tests/test_cli.py``.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from netprocs import STEP_SIGNATURE, config, served

import rlreplay
from rlreplay.errors import ServerUnavailableError

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
CONFIG = config({"name": "t", "signature": STEP_SIGNATURE, "max_size": 100})


def cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlreplay.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    for name in ("server", "client", "stranger"):
        result = cli("keygen", str(folder), "--name", name)
        assert result.returncode == 0, result.stderr
    authorized = folder / "authorized"
    authorized.mkdir()
    shutil.copy(folder / "client.key", authorized / "client.key")
    return folder


CLIENTS = {
    "right_keys": (
        lambda k: dict(
            server_public_key=str(k / "server.key"), client_secret_key=str(k / "client.key_secret")
        ),
        True,
    ),
    "no_keys": (lambda k: {}, False),
    "unauthorized_client_key": (
        lambda k: dict(
            server_public_key=str(k / "server.key"),
            client_secret_key=str(k / "stranger.key_secret"),
        ),
        False,
    ),
    "ephemeral_client_key": (lambda k: dict(server_public_key=str(k / "server.key")), False),
    "wrong_server_key": (
        lambda k: dict(
            server_public_key=str(k / "stranger.key"),
            client_secret_key=str(k / "client.key_secret"),
        ),
        False,
    ),
}


@pytest.fixture(scope="module")
def curve_address(keys):
    kwargs = dict(
        curve_secret_key=str(keys / "server.key_secret"), authorized_keys=str(keys / "authorized")
    )
    with served(CONFIG, **kwargs) as (address, _):
        yield address


@pytest.mark.parametrize("case", sorted(CLIENTS))
def test_curve_server_serves_only_clients_with_the_right_keys(keys, curve_address, case):
    make_kwargs, accepted = CLIENTS[case]
    client = rlreplay.Client(curve_address, call_timeout=1.0, **make_kwargs(keys))
    try:
        if accepted:
            assert client.ping(timeout=5.0) == ["t"]
            assert client.info("t").size == 0
        else:
            with pytest.raises(ServerUnavailableError):
                client.ping(timeout=1.0)
    finally:
        client.close()


def test_keygen_writes_a_private_secret_key(keys):
    assert (keys / "server.key").exists()
    assert os.stat(keys / "server.key_secret").st_mode & 0o077 == 0


@pytest.fixture
def toml(tmp_path):
    path = tmp_path / "tables.toml"
    path.write_text(
        """
[[store]]
name = "steps"
capacity = 1000
signature = { obs = { shape = [3], dtype = "float32" }, reward = "float32" }

[[table]]
name = "replay"
store = "steps"
layout = { type = "transition", n_step = 1 }
sampler = { type = "Prioritized", priority_exponent = 0.6 }
[table.rate_limiter]
type = "SampleToInsertRatio"
samples_per_insert = 4.0
min_size_to_sample = 10
error_buffer = 40.0

[[table]]
name = "queue"
kind = "queue"
size = 100
signature = { obs = { shape = [3], dtype = "float32" } }
"""
    )
    return path


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_its_address_answers_info_and_stops_on_signal(toml, sig):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlreplay.cli", "serve", "--config", str(toml)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving replay, queue on tcp://127.0.0.1:"), line
        address = line.split(" on ")[1].strip()
        info = cli("info", address)
        assert info.returncode == 0, info.stderr
        header = info.stdout.splitlines()[0].split()
        assert header[:5] == ["table", "size", "capacity", "sampler", "remover"]
        assert "samples/s" in header and "spi" in header
        assert "Prioritized(priority_exponent=0.6)" in info.stdout
        proc.send_signal(sig)
        assert proc.wait(timeout=15.0) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5.0)
        proc.stdout.close()
        proc.stderr.close()


def test_a_server_key_given_as_its_secret_file_works_but_warns(tmp_path, caplog):
    from rlreplay.net.wire import auth

    public_file, secret_file = auth.keygen(tmp_path, "server")
    with caplog.at_level("WARNING", logger="rlreplay"):
        public = auth.public_key(public_file)
        assert auth.public_key(secret_file) == public
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "is a secret key file" in said[0], said
