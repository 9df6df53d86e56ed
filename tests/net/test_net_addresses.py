"""Where a server binds and why a client cannot reach it: typed errors that say what to do.

Real servers on 127.0.0.1; every call is bounded by a short timeout.
"""

from __future__ import annotations

import logging
import socket
import time

import numpy as np
import pytest

import rlreplay
from rlreplay.errors import AddressInUseError, InvalidArgumentError, ServerUnavailableError
from rlreplay.net.client import transport
from rlreplay.net.wire import auth


def small_table() -> rlreplay.Table:
    return rlreplay.Table("t", signature={"x": "float32"}, max_size=10)


def dead_address() -> str:
    """A loopback address nothing listens on (its port was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


# ------------------------------------------------------------------ binding
def test_server_on_a_port_in_use_raises_address_in_use_naming_the_address():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = rlreplay.Server([small_table()], port=port)
        with pytest.raises(AddressInUseError) as caught:
            server.start()
    error = caught.value
    assert isinstance(error, InvalidArgumentError) and rlreplay.AddressInUseError is type(error)
    assert error.address == f"tcp://127.0.0.1:{port}"
    assert f"tcp://127.0.0.1:{port}" in str(error) and "already in use" in str(error)
    assert "another port" in str(error)
    with rlreplay.Server([small_table()]) as other:  # nothing of the failed start is left
        assert rlreplay.Client(other.address).ping(timeout=5.0) == ["t"]


@pytest.mark.parametrize("tables", ["table", "name", "mapping", "list_of_names"])
def test_server_given_anything_but_a_list_of_tables_says_to_pass_a_list(tables):
    table = small_table()
    given = {"table": table, "name": "t", "mapping": {"t": table}, "list_of_names": ["t"]}
    with pytest.raises(InvalidArgumentError, match=r"must be a list of tables.*Server\(\[table"):
        rlreplay.Server(given[tables])


def test_server_accepts_any_iterable_of_tables():
    tables = {"t": small_table()}
    with rlreplay.Server(tables.values()) as server:
        assert list(server.tables) == ["t"]


@pytest.mark.parametrize("bind", ["localhost:8000", "tcp://127.0.0.1:8001", "[::1]:8000"])
def test_server_bind_with_a_port_says_to_give_the_port_as_port(bind):
    with pytest.raises(InvalidArgumentError) as caught:
        rlreplay.Server([small_table()], bind=bind, insecure=True)
    message = str(caught.value)
    assert "without a port" in message and "port=" in message and "loopback" not in message


def test_server_that_cannot_bind_raises_a_typed_error_and_logs_no_insecure_warning(caplog):
    server = rlreplay.Server([small_table()], bind="192.0.2.1", insecure=True)  # TEST-NET-1
    with (
        caplog.at_level(logging.WARNING, logger="rlreplay.net"),
        pytest.raises(InvalidArgumentError, match=r"cannot serve on tcp://192\.0\.2\.1:0"),
    ):
        server.start()
    assert "WITHOUT authentication" not in caplog.text


# ------------------------------------------------------ an unreachable server
UNREACHABLE_CALLS = {
    "sample": lambda c: c.sample("t", 1, timeout=0.5),
    "info": lambda c: c.info("t"),
    "ping": lambda c: c.ping(timeout=0.5),
    "insert": lambda c: c.insert("t", {"x": np.ones(1)}, timeout=0.5),
}


DIAGNOSE_S = 2.0  # the diagnosis window these tests give a client


def test_a_host_name_that_does_not_resolve_is_named_as_such():
    # ".invalid" is reserved (RFC 2606): no resolver answers it with an address.
    client = rlreplay.Client("no-such-host.invalid:8000", call_timeout=0.5)
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError) as caught:
        client.ping(timeout=0.5)
    client.close()
    assert caught.value.reason == "unresolved"
    assert "host name does not resolve" in str(caught.value)
    assert "no-such-host.invalid" in str(caught.value)
    assert time.monotonic() - start < 0.5 + DIAGNOSE_S + 2.0


@pytest.mark.parametrize("call", sorted(UNREACHABLE_CALLS))
def test_client_with_nothing_listening_says_so_within_its_timeout(call):
    # A generous diagnosis window, so a loaded machine still tells why; a refused
    # connection is recognised at its first retry, long before the window ends.
    client = rlreplay.Client(dead_address(), call_timeout=0.5, diagnose_timeout=DIAGNOSE_S)
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError) as caught:
        UNREACHABLE_CALLS[call](client)
    elapsed = time.monotonic() - start
    client.close()
    assert caught.value.reason == "refused"
    assert "nothing accepts connections there" in str(caught.value)
    # the request that went unanswered is named: the call's own, or the handshake before it
    named = {
        "info": "the handshake before info",
        "ping": "ping",
        "insert": "the handshake",
        "sample": "the handshake before sample",
    }
    assert f"no reply to {named[call]}" in str(caught.value)
    # the timeout, its reply grace, and the short diagnosis after the failure
    assert elapsed < 0.5 + transport.REPLY_GRACE_S + DIAGNOSE_S + 0.75


def test_client_without_keys_on_a_curve_server_is_told_to_give_them(tmp_path):
    auth.keygen(tmp_path, "server")
    server = rlreplay.Server([small_table()], curve_secret_key=str(tmp_path / "server.key_secret"))
    with server:
        client = rlreplay.Client(server.address, diagnose_timeout=DIAGNOSE_S)
        with pytest.raises(ServerUnavailableError) as caught:
            client.ping(timeout=0.5)
        client.close()
    assert caught.value.reason == "needs_curve"
    assert "uses CURVE" in str(caught.value) and "server_public_key=" in str(caught.value)


def test_the_connection_is_diagnosed_only_after_a_call_failed(monkeypatch):
    calls = []
    diagnose = auth.diagnose_connection

    def counted(*args, **kwargs):
        calls.append(args[0])
        return diagnose(*args, **kwargs)

    monkeypatch.setattr(auth, "diagnose_connection", counted)
    with rlreplay.Server([small_table()]) as server:
        client = rlreplay.Client(server.address, call_timeout=5.0)
        client.insert("t", {"x": np.ones(4)}, timeout=5.0)
        client.sample("t", 2, timeout=5.0)
        assert client.info("t").size == 4 and calls == []
        address = server.address
    with pytest.raises(ServerUnavailableError):
        client.ping(timeout=0.5)
    client.close()
    assert calls == [address]


def test_a_missing_key_file_is_said_not_to_exist(tmp_path):
    missing = str(tmp_path / "nope.key")
    with pytest.raises(InvalidArgumentError, match=r"'.*nope\.key' does not exist"):
        rlreplay.Client("tcp://127.0.0.1:5555", server_public_key=missing)
    with pytest.raises(InvalidArgumentError, match="is a folder, not a key file"):
        rlreplay.Client("tcp://127.0.0.1:5555", server_public_key=str(tmp_path))


def test_a_client_can_skip_or_lengthen_the_diagnosis_and_refuses_a_bad_window():
    client = rlreplay.Client(dead_address(), call_timeout=0.3, diagnose_timeout=0)
    with pytest.raises(ServerUnavailableError) as caught:
        client.ping(timeout=0.3)
    client.close()
    assert caught.value.reason is None
    for bad in (-1, "1", True, 61):
        with pytest.raises(InvalidArgumentError, match="diagnose_timeout"):
            rlreplay.Client(dead_address(), diagnose_timeout=bad)
