"""A client pickles as its settings (the current call timeout included) and refuses invalid
ones before it opens anything. A client opens no socket until its first call, so no server
is needed here."""

import pickle

import pytest
import zmq

import rlreplay
from rlreplay.errors import InvalidArgumentError


def test_a_pickled_client_keeps_every_setting_and_its_current_call_timeout():
    server_public, _ = zmq.curve_keypair()
    keys = zmq.curve_keypair()
    client = rlreplay.Client(
        "localhost:5999",
        server_public_key=server_public,
        client_secret_key=keys,
        call_timeout=3.0,
        liveness_s=2.0,
        diagnose_timeout=0.5,
        shared_memory=False,
    )
    client.call_timeout = 7.0
    copy = pickle.loads(pickle.dumps(client))
    assert copy.address == client.address == "tcp://localhost:5999"
    assert copy.call_timeout == 7.0 and copy.liveness_s == 2.0
    assert copy.__getstate__() == client.__getstate__()
    assert copy.__getstate__() == {
        "address": "tcp://localhost:5999",
        "server_public_key": server_public,
        "client_secret_key": keys,
        "call_timeout": 7.0,
        "liveness_s": 2.0,
        "diagnose_timeout": 0.5,
        "shared_memory": False,
    }
    assert not copy._shm.enabled


def test_a_client_without_curve_pickles_without_keys():
    copy = pickle.loads(pickle.dumps(rlreplay.Client("ipc:///tmp/rlreplay-settings-test")))
    state = copy.__getstate__()
    assert state["server_public_key"] is None and state["client_secret_key"] is None
    assert state["shared_memory"] is None


@pytest.mark.parametrize(
    "argument, value",
    [
        ("liveness_s", 0),
        ("liveness_s", True),
        ("liveness_s", "5"),
        ("diagnose_timeout", -1),
        ("diagnose_timeout", 61),
        ("diagnose_timeout", False),
        ("call_timeout", -1.0),
        ("call_timeout", None),
        ("call_timeout", True),
        ("shared_memory", "auto"),
    ],
)
def test_an_invalid_setting_is_refused_naming_it(argument, value):
    with pytest.raises(InvalidArgumentError, match=argument):
        rlreplay.Client("127.0.0.1:5999", **{argument: value})


@pytest.mark.parametrize("value", [None, 0, -1.0, True, "5"])
def test_setting_an_invalid_call_timeout_is_refused_naming_it_and_changes_nothing(value):
    """``call_timeout=None`` used to be taken, and every later call then failed with a
    TypeError; a negative one was refused as ``timeout``, with advice about can_sample."""
    client = rlreplay.Client("127.0.0.1:5999", call_timeout=3.0)
    with pytest.raises(InvalidArgumentError, match="call_timeout"):
        client.call_timeout = value
    assert client.call_timeout == 3.0
