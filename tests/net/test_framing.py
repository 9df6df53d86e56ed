"""Sending and receiving one message's frames (rlreplay.net.wire.framing) on real sockets."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from rlreplay.net.wire import codec, framing


@pytest.fixture
def pair():
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for s in (router, dealer):
        s.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    yield router, dealer
    router.close()
    dealer.close()
    ctx.term()


def _receive(sock: zmq.Socket) -> list:
    assert sock.poll(5000), "no message within 5 s"
    return framing.receive(sock)


def test_a_message_of_small_and_large_frames_arrives_whole_and_in_order(pair):
    router, dealer = pair
    big = np.arange(codec.ZERO_COPY_BYTES // 8 * 3, dtype=np.int64)  # goes without a copy
    header, arrays = {"op": "update_priorities", "table": "t"}, {
        "keys": np.arange(256, dtype=np.int64),
        "priorities": np.linspace(0.0, 1.0, 256),
        "big": big,
    }
    frames = codec.encode(header, arrays)
    assert type(frames[0]) is bytes and isinstance(frames[-1], np.ndarray)
    framing.send(dealer, frames)
    got = _receive(router)
    assert all(isinstance(f, zmq.Frame) for f in got)
    identity, body = got[0], got[1:]
    h, a = codec.decode(body)
    assert h["op"] == "update_priorities" and h["table"] == "t"
    for name, arr in arrays.items():
        np.testing.assert_array_equal(a[name], arr)
    # a reply through the routing id received as a Frame reaches the sender
    framing.send(router, codec.encode({"id": 1, "ok": True}), identity)
    reply = _receive(dealer)
    assert codec.decode(reply)[0]["ok"] is True


def test_a_packed_frame_larger_than_the_copy_limit_arrives_intact(pair):
    """Many small arrays make one packed ``bytes`` frame larger than ZERO_COPY_BYTES,
    which goes without a copy (a writer chunk of many columns)."""
    router, dealer = pair
    arrays = {f"c{i}": np.full(1000, i, dtype=np.float64) for i in range(20)}
    frames = codec.encode({"op": "write"}, arrays)
    assert type(frames[1]) is bytes and len(frames[1]) > codec.ZERO_COPY_BYTES
    framing.send(dealer, frames)
    _, got = codec.decode(_receive(router)[1:])
    for name, arr in arrays.items():
        np.testing.assert_array_equal(got[name], arr)


def test_a_single_frame_message_and_an_empty_frame(pair):
    router, dealer = pair
    framing.send(dealer, [b""])
    got = _receive(router)
    assert len(got) == 2 and got[1].bytes == b""
    framing.send(dealer, [b"a", b"", b"c"])
    assert [f.bytes for f in _receive(router)[1:]] == [b"a", b"", b"c"]


def test_send_raises_again_when_the_message_cannot_be_queued():
    ctx = zmq.Context()
    lonely = ctx.socket(zmq.DEALER)  # no peer: a DEALER cannot queue anything
    lonely.setsockopt(zmq.LINGER, 0)
    try:
        with pytest.raises(zmq.Again):
            framing.send(lonely, [b"header", b"body"])
    finally:
        lonely.close()
        ctx.term()


@pytest.mark.parametrize(
    "sizes",
    [
        pytest.param((10, 20_000, 3, 30_000), id="large-among-small"),
        pytest.param((20_000, 30_000), id="only-large"),
        pytest.param((3, 5, 7), id="only-small"),
        pytest.param((30_000, 1), id="large-first"),
    ],
)
def test_encoded_arrays_decode_to_themselves_whatever_their_sizes_and_order(sizes):
    """Large arrays (>= ZERO_COPY_BYTES) get frames of their own after the one packed
    frame of the small ones; decode finds each where the header says."""
    rng = np.random.default_rng(0)
    arrays = {f"a{i}": rng.random(n) for i, n in enumerate(sizes)}
    arrays["odd"] = np.arange(3, dtype=np.int8)  # pads the next array to 8 bytes
    arrays["grid"] = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # not contiguous
    arrays["scalar"] = np.array(2.5)
    frames = codec.encode({"op": "x"}, arrays)
    large = sum(a.nbytes >= codec.ZERO_COPY_BYTES for a in arrays.values())
    assert len(frames) == 2 + large  # header, packed small ones, one per large
    received = [f.tobytes() if isinstance(f, np.ndarray) else f for f in frames]  # as bytes
    _, got = codec.decode(received)
    assert list(got) == list(arrays)
    for name, arr in arrays.items():
        assert got[name].shape == arr.shape and got[name].dtype == arr.dtype
        np.testing.assert_array_equal(got[name], arr)


def test_a_header_that_cannot_be_packed_leaves_the_next_message_intact():
    """Headers are packed by a packer kept per thread: a failed pack must not leave
    bytes behind in it for the next message."""
    with pytest.raises(TypeError):
        codec.encode({"op": "ping", "bad": object()})
    header, _ = codec.decode(codec.encode({"op": "ping", "id": 3}))
    assert header == {"op": "ping", "id": 3, "v": codec.PROTOCOL_VERSION}
