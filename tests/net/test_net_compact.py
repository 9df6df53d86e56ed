"""Compact link messages (rlreplay.net.compact): the same requests as the general encoding,
refusals of what does not fit, malformed messages from the network (typed errors, a live
server, nothing applied), and the wait that polls a link without sleeping first."""

from __future__ import annotations

import contextlib
import random
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from netprocs import config, served

import rlreplay
from rlreplay.core import cpus
from rlreplay.errors import InvalidArgumentError, ProtocolError
from rlreplay.net import compact, direct, wire

pytestmark = pytest.mark.skipif(not direct.supported(), reason="needs AF_UNIX SOCK_SEQPACKET")

SIGNATURE = {"obs": {"shape": [3], "dtype": "float32"}, "step": "int64"}
CONFIG = config(
    {"name": "t", "signature": SIGNATURE, "capacity": 5000, "sampler": {"type": "Prioritized"}}
)


def joined(buffers: list) -> bytes:
    return b"".join(bytes(memoryview(b).cast("B")) for b in buffers)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    op=st.sampled_from(sorted(compact.OPS)),
    n=st.integers(0, 300),
    m=st.integers(0, 300),
    table=st.text(max_size=40),
    rid=st.integers(0, 2**63 - 1),
    epoch=st.none() | st.integers(-(2**63) + 1, 2**63 - 1),
    expires=st.none() | st.floats(allow_nan=False),
    lease=st.none() | st.floats(allow_nan=False),
)
def test_a_compact_request_decodes_to_the_request_it_encodes(
    op, n, m, table, rid, epoch, expires, lease
):
    rng = np.random.default_rng(n * 1000 + m)
    keys = rng.integers(-(2**62), 2**62, n)
    arrays = {"keys": keys}
    if op == "update_priorities":
        arrays["priorities"] = rng.random(m)
    header = {"op": op, "table": table, "id": rid}
    for name, value in (("epoch", epoch), ("expires", expires), ("lease", lease)):
        if value is not None:
            header[name] = value
    data = joined(compact.encode_request(header, arrays))
    assert compact.is_request(data) and not compact.is_reply(data)
    assert compact.request_id(data) == rid
    got_header, got_arrays = compact.decode_request(data)
    assert got_header == {**header, "v": wire.PROTOCOL_VERSION}
    assert got_arrays.keys() == arrays.keys()
    for name, a in arrays.items():
        np.testing.assert_array_equal(got_arrays[name], a)
        assert got_arrays[name].dtype == a.dtype


K = np.arange(4, dtype=np.int64)
P = np.ones(4)
BASE = {"op": "update_priorities", "table": "t", "id": 1}
NOT_COMPACT = {
    "one-priority-for-all": (BASE, {"keys": K, "priorities": np.float64(1.0)}),
    "int32-keys": (BASE, {"keys": K.astype(np.int32), "priorities": P}),
    "float32-priorities": (BASE, {"keys": K, "priorities": P.astype(np.float32)}),
    "2d-keys": (BASE, {"keys": K.reshape(2, 2), "priorities": P}),
    "strided-keys": (BASE, {"keys": np.arange(8)[::2], "priorities": P}),
    "timeout-field": ({**BASE, "timeout": 1.0}, {"keys": K, "priorities": P}),
    "noreply": ({**BASE, "noreply": True}, {"keys": K, "priorities": P}),
    "string-id": ({**BASE, "id": "a"}, {"keys": K, "priorities": P}),
    "negative-id": ({**BASE, "id": -1}, {"keys": K, "priorities": P}),
    "int-expires": ({**BASE, "expires": 5}, {"keys": K, "priorities": P}),
    "other-op": ({**BASE, "op": "info"}, {"keys": K, "priorities": P}),
    "no-arrays": (BASE, None),
    "delete-with-priorities": ({**BASE, "op": "delete"}, {"keys": K, "priorities": P}),
    "extra-array": (BASE, {"keys": K, "priorities": P, "x": P}),
    "larger-than-a-link-message": (
        BASE,
        {"keys": np.arange(4100, dtype=np.int64), "priorities": np.ones(4100)},
    ),
}


@pytest.mark.parametrize("header, arrays", NOT_COMPACT.values(), ids=NOT_COMPACT.keys())
def test_requests_that_do_not_fit_the_layout_are_left_to_the_general_encoding(header, arrays):
    before = dict(header)
    assert compact.encode_request(header, arrays) is None
    assert header == before


def valid_request(n: int = 8) -> bytes:
    header = {"op": "update_priorities", "table": "t", "id": 7, "epoch": 3, "expires": 1.0}
    return joined(
        compact.encode_request(
            header, {"keys": np.arange(n, dtype=np.int64), "priorities": np.ones(n)}
        )
    )


MALFORMED = {
    "short": lambda d: d[:20],
    "truncated-arrays": lambda d: d[:-8],
    "trailing-bytes": lambda d: d + b"\0" * 8,
    "unknown-op": lambda d: bytes([0x7F]) + d[1:],
    "delete-with-priorities": lambda d: bytes([2]) + d[1:],
    "name-not-utf8": lambda d: d[:48] + b"\xff" + d[49:],
    "name-longer-than-message": lambda d: d[:4] + (60000).to_bytes(2, "little") + d[6:],
}


@pytest.mark.parametrize("mutate", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_compact_requests_raise_protocol_errors(mutate):
    with pytest.raises(ProtocolError):
        compact.decode_request(mutate(valid_request()))


@settings(
    max_examples=3000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.binary(max_size=200), flips=st.lists(st.integers(0, 400), max_size=6))
def test_decoding_any_bytes_raises_nothing_but_protocol_errors(data, flips):
    message = bytearray(valid_request(4) if len(flips) % 2 else data)
    for at in flips:
        if message:
            message[at % len(message)] ^= 1 << (at % 8)
    for decode in (compact.decode_request, compact.decode_reply):
        with contextlib.suppress(ProtocolError):
            decode(bytes(message))


def test_replies_round_trip_and_results_that_do_not_fit_are_left_general():
    data = compact.encode_reply("delete", 9, 2**62, 12.5, {"count": 3})
    assert compact.is_reply(data) and not compact.is_request(data)
    assert compact.decode_reply(data) == {
        "id": 9,
        "ok": True,
        "epoch": 2**62,
        "now": 12.5,
        "count": 3,
    }
    assert compact.encode_reply("delete", 9, 1, 1.0, {"count": 3, "more": 1}) is None
    assert compact.encode_reply("delete", "x", 1, 1.0, {"count": 3}) is None
    assert compact.encode_reply("delete", 9, 1, float("nan"), {"count": 3}) is None
    for bad in (data[:-1], data + b"\0", bytes([0x7F]) + data[1:]):
        with pytest.raises(ProtocolError):
            compact.decode_reply(bad)


def raw_call(link, data: bytes, limit_s: float = 5.0) -> dict:
    """Send ``data`` on a client's link by hand; the reply's header."""
    link.sock.send(data)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        reply = link.receive()
        if reply is not None:
            if compact.is_reply(reply):
                return compact.decode_reply(reply)
            return wire.decode(direct.frames_of(reply))[0]
        time.sleep(0.0005)
    raise AssertionError("no reply on the link")


def test_a_server_answers_mutated_compact_requests_with_typed_errors_and_stays_up():
    with served(CONFIG) as (address, _):
        client = rlreplay.Client(address)
        keys = client.insert(
            "t", {"obs": np.ones((50, 3), np.float32), "step": np.arange(50)}, wait=True
        )
        client.update_priorities("t", keys, np.full(50, 2.0))  # opens the link
        ch = client._transport.channel()
        link, epoch = ch.direct, ch.epoch
        assert link is not None
        good = {"op": "update_priorities", "table": "t", "id": 1, "epoch": epoch}
        arrays = {"keys": keys[:10].copy(), "priorities": np.full(10, 3.0)}
        valid = joined(compact.encode_request(good, arrays))
        assert raw_call(link, valid)["count"] == 10
        # the envelope and the table are checked as for any request
        cases = {
            "old-epoch": ({**good, "epoch": epoch + 1}, "ServerRestartedError"),
            "expired": ({**good, "expires": 0.0}, "ReplayTimeoutError"),
            "no-table": ({**good, "table": "nope"}, "InvalidArgumentError"),
        }
        for header, error in cases.values():
            reply = raw_call(link, joined(compact.encode_request(header, arrays)))
            assert (
                not reply["ok"] and type(wire.error_from_code(reply["code"], "")).__name__ == error
            )
        bad = {"keys": keys[:2].copy(), "priorities": np.array([1.0, -1.0])}
        reply = raw_call(link, joined(compact.encode_request(good, bad)))
        assert wire.ERROR_CODES[reply["code"]] is InvalidArgumentError
        rng = random.Random(0)
        for i in range(1500):
            message = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                message[rng.randrange(len(message))] ^= 1 << rng.randrange(8)
            if i % 5 == 0:
                message = message[: rng.randrange(len(message))]
            if not compact.is_request(message):
                continue  # a general message: the wire fuzz test's ground
            reply = raw_call(link, bytes(message))
            assert reply["ok"] or reply["code"] != wire.INTERNAL_ERROR, reply
        # the server still serves, and the table holds what the valid calls set
        info = client.info("t")
        assert info.size == 50
        s = client.sample("t", 500)
        # mutated priorities that were still valid may have applied; none is negative or NaN
        assert np.all(np.isfinite(s.info.priorities)) and np.all(s.info.priorities >= 0)
        client.close()


@pytest.mark.parametrize(
    "text, cpu_count, expected",
    [("", 2, direct.SPIN_US * 1e-6), ("0", 2, 0.0), ("200", 4, 200e-6), ("", 1, 0.0)],
    ids=["default", "off", "set", "one-cpu"],
)
def test_the_wait_on_a_link_spins_as_configured(monkeypatch, text, cpu_count, expected):
    monkeypatch.setenv(direct.SPIN_VARIABLE, text)
    monkeypatch.setattr(direct, "cpus", lambda: cpu_count)
    assert direct.spin_seconds.__wrapped__() == pytest.approx(expected)


@pytest.mark.parametrize("text", ["x", "-1", "1.5", "20000"])
def test_a_bad_spin_setting_is_refused_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv(direct.SPIN_VARIABLE, text)
    with pytest.raises(InvalidArgumentError, match=direct.SPIN_VARIABLE):
        direct.spin_seconds.__wrapped__()


def test_a_client_refuses_a_bad_spin_setting_when_made(monkeypatch):
    monkeypatch.setenv(direct.SPIN_VARIABLE, "soon")
    direct.spin_seconds.cache_clear()
    try:
        with pytest.raises(InvalidArgumentError, match=direct.SPIN_VARIABLE):
            rlreplay.Client("tcp://127.0.0.1:5555")
        rlreplay.Client("tcp://127.0.0.1:5555", direct_calls=False).close()  # not read
    finally:
        direct.spin_seconds.cache_clear()


def test_cpus_counts_at_least_one():
    assert cpus.cpus() >= 1


@pytest.mark.parametrize("server_reads_compact", [True, False], ids=["offered", "older-server"])
def test_compact_messages_go_only_to_a_server_whose_offer_says_it_reads_them(
    monkeypatch, server_reads_compact
):
    from rlreplay.net.direct_server import DirectLinks
    from rlreplay.net.request_handler import RequestHandler

    offer, handle_compact = DirectLinks.offer, RequestHandler.handle_compact
    seen = []

    def older_offer(self, client, now):
        made = offer(self, client, now)
        if made is not None and not server_reads_compact:
            del made["compact"]  # as a server that predates compact messages offers
        return made

    def counted(self, identity, data):
        seen.append(len(data))
        return handle_compact(self, identity, data)

    monkeypatch.setattr(DirectLinks, "offer", older_offer)
    monkeypatch.setattr(RequestHandler, "handle_compact", counted)
    table = rlreplay.Table(
        "t", signature={"x": "float32"}, max_size=100, sampler=rlreplay.Prioritized()
    )
    server = rlreplay.Server([table], bind="127.0.0.1").start()
    try:
        client = rlreplay.Client(server.address)
        keys = client.insert("t", {"x": np.zeros(10, np.float32)}, wait=True)
        assert client.update_priorities("t", keys, np.full(10, 2.0)) == 10
        assert client.delete("t", keys[:3]) == 3
        assert client._transport.channel().direct is not None  # both took the link
        assert len(seen) == (2 if server_reads_compact else 0)
        assert table.info().size == 7
        client.close()
    finally:
        server.stop()
