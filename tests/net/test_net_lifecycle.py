"""Dead or missing servers give typed errors in bounded time; clients pickle and reconnect;
servers stop cleanly."""

from __future__ import annotations

import pickle
import socket
import time

import numpy as np
import pytest
from netprocs import CTX, STEP_SIGNATURE, config, pickled_client_inserts, served

import rlreplay
from rlreplay.errors import ClosedError, InvalidArgumentError, ServerUnavailableError

CONFIG = config({"name": "t", "signature": STEP_SIGNATURE, "max_size": 100})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(n: int) -> dict:
    return {"obs": np.zeros((n, 3), np.float32), "step": np.arange(n)}


@pytest.mark.parametrize("timeout", [0.5, None])
def test_killed_server_gives_a_typed_error_within_the_timeout(timeout):
    with served(CONFIG) as (address, proc):
        client = rlreplay.Client(address, liveness_s=0.5)
        client.insert("t", rows(2))
        proc.kill()
        proc.join(10.0)
        start = time.monotonic()
        with pytest.raises(ServerUnavailableError):
            client.sample("t", 1, timeout=timeout)
        limit = (timeout or 2 * 0.5) + 1.0
        assert time.monotonic() - start < limit


CALLS_WITHOUT_SERVER = {
    "ping": lambda c: c.ping(timeout=0.3),
    "info": lambda c: c.info("t"),
    "sample": lambda c: c.sample("t", 1, timeout=0.3),
    "update_priorities": lambda c: c.update_priorities("t", [0], [1.0]),
}


@pytest.mark.parametrize("call", sorted(CALLS_WITHOUT_SERVER))
def test_no_server_listening_gives_server_unavailable(call):
    client = rlreplay.Client(f"tcp://127.0.0.1:{free_port()}", call_timeout=0.3)
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError):
        CALLS_WITHOUT_SERVER[call](client)
    assert time.monotonic() - start < 2.0
    client.close()


def test_pickled_client_reconnects_in_a_spawned_process():
    with served(CONFIG) as (address, _):
        client = rlreplay.Client(address)
        client.ping()
        copy = pickle.loads(pickle.dumps(client))
        assert copy.address == client.address
        out = CTX.Queue()
        child = CTX.Process(target=pickled_client_inserts, args=(client, "t", 5, out))
        child.start()
        try:
            status, keys = out.get(timeout=30.0)
        finally:
            child.join(10.0)
            if child.is_alive():
                child.kill()
        assert status == "ok", keys
        assert client.info("t").size == 5
        assert client.delete("t", keys) == 5


def test_a_closed_client_raises_closed_error_and_its_pickled_copy_connects_anywhere():
    """One rule for every closed object (a table, a writer, a client): its calls raise
    ClosedError; a client pickles as its address, so a copy is a new, open client."""
    with served(CONFIG) as (address, _):
        client = rlreplay.Client(address)
        client.insert("t", rows(2))
        writer = client.trajectory_writer("t")
        it = client.sample_iterator("t", 1)
        client.close()
        client.close()  # closing again does nothing
        for call in (
            lambda: client.info("t"),
            lambda: client.insert("t", rows(1)),
            lambda: client.sample("t", 1, timeout=1.0),
            lambda: client.update_priorities("t", [0], [1.0]),
            lambda: client.ping(),
            lambda: writer.append({"obs": np.zeros(3, np.float32), "step": np.int64(0)}),
            lambda: next(it),
        ):
            with pytest.raises(ClosedError, match="was closed"):
                call()
        with rlreplay.Client(address) as scoped:
            assert scoped.info("t").size == 2
        with pytest.raises(ClosedError):  # the end of a with block closes it too
            scoped.info("t")
        copy = pickle.loads(pickle.dumps(client))
        assert copy.info("t").size == 2
        out = CTX.Queue()
        child = CTX.Process(target=pickled_client_inserts, args=(client, "t", 3, out))
        child.start()
        try:
            status, keys = out.get(timeout=30.0)
        finally:
            child.join(10.0)
            if child.is_alive():
                child.kill()
        assert status == "ok", keys
        assert copy.info("t").size == 5
        copy.close()


def test_stopping_the_server_answers_parked_calls_with_closed_error():
    table = rlreplay.Table(
        "t", signature={"x": "float32"}, max_size=10, rate_limiter=rlreplay.MinSize(5)
    )
    server = rlreplay.Server([table]).start()
    client = rlreplay.Client(server.address)
    rid = client.sample_async("t", 1, timeout=30.0)
    time.sleep(0.2)
    server.stop()
    assert server.wait(1.0)
    with pytest.raises(ClosedError):
        client.sample_result(rid, timeout=5.0)
    client.close()


@pytest.mark.parametrize("bind", ["127.0.0.1", "localhost", "::1", "ipc"])
def test_server_picks_a_free_port_on_loopback_or_serves_a_unix_socket(tmp_path, bind):
    table = rlreplay.Table("t", signature={"x": "float32"}, max_size=10)
    if bind == "ipc":
        bind = f"ipc://{tmp_path}/replay.sock"
    with rlreplay.Server([table], bind=bind) as server:
        assert not server.address.endswith((":0", ":*"))
        client = rlreplay.Client(server.address)
        client.insert("t", {"x": np.ones(3)})
        client.close()
    assert table.size == 3


BAD_SERVERS = {
    "public_without_curve": dict(bind="0.0.0.0"),
    "duplicate_names": dict(duplicate=True),
    "bad_port": dict(port=70000),
}


@pytest.mark.parametrize("case", sorted(BAD_SERVERS))
def test_server_rejects_unsafe_or_inconsistent_configuration(case):
    kwargs = dict(BAD_SERVERS[case])
    table = rlreplay.Table("t", signature={"x": "float32"}, max_size=10)
    tables = [table, table] if kwargs.pop("duplicate", False) else [table]
    with pytest.raises(InvalidArgumentError):
        rlreplay.Server(tables, **kwargs)


def test_import_rlreplay_does_not_import_zmq():
    import subprocess
    import sys

    code = "import sys, rlreplay; assert 'zmq' not in sys.modules and 'msgpack' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_metrics_endpoint_reports_each_table():
    pytest.importorskip("prometheus_client")
    import urllib.request

    table = rlreplay.Table("t", signature={"x": "float32"}, max_size=10)
    table.insert({"x": np.ones(3)})
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with rlreplay.Server([table], metrics_port=port), urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    assert 'rlreplay_table_size{table="t"} 3.0' in text
    assert "rlreplay_table_samples_per_s" in text


def test_metrics_port_without_prometheus_client_is_skipped_with_a_warning(caplog):
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is not None:
        pytest.skip("prometheus-client is installed; the fallback cannot be exercised")
    table = rlreplay.Table("t", signature={"x": "float32"}, max_size=10)
    with rlreplay.Server([table], metrics_port=free_port()) as server:
        assert rlreplay.Client(server.address).ping() == ["t"]
    assert "prometheus-client is not installed" in caplog.text


def test_a_dispatcher_that_fails_before_serving_fails_start_in_bounded_time(monkeypatch):
    table = rlreplay.Table("t", signature={"step": "int64"}, max_size=10)

    def broken(*args, **kwargs):
        raise OSError("no waker")

    monkeypatch.setattr(type(table.store), "add_waker", broken)
    monkeypatch.setattr("threading.excepthook", lambda args: None)  # the thread's traceback
    server = rlreplay.Server([table], port=free_port(), bind="127.0.0.1")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="ended before serving"):
        server.start()
    assert time.monotonic() - start < 5.0
    server.stop()
