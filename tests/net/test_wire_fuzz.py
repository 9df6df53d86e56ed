"""Malformed requests of every kind get typed errors, never internal ones, and change
nothing: a few thousand mutated messages against a real server on 127.0.0.1.

The mutations are those of ``python -m benchmarks.stress_wire`` (which runs 100k of them
and prints the figures); here hypothesis draws them, deterministically.
"""

from __future__ import annotations

import logging
import math
import random
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.stress_wire import KINDS, Harness
from rlreplay.errors import ProtocolError
from rlreplay.net.wire import codec
from rlreplay.net.wire.shm_segments import check_entries

CASES = 4000


@pytest.fixture(scope="module")
def harness():
    logger = logging.getLogger("rlreplay.net")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # rejected requests are counted, not logged
    try:
        with Harness(reply_wait_s=5.0) as h:
            yield h
    finally:
        logger.setLevel(level)


def test_mutated_requests_of_every_kind_get_typed_errors_and_leave_tables_intact(harness):
    h = harness

    @settings(
        max_examples=CASES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(kind=st.sampled_from(KINDS), rng=st.randoms(use_true_random=False))
    def case(kind: str, rng: random.Random) -> None:
        h.run_case(kind, rng)
        assert not h.internal, h.internal[:3]
        assert not h.not_intact, h.not_intact[:3]
        assert not h.no_reply, h.no_reply[:3]

    case()
    assert set(h.cases) == set(KINDS)
    assert sum(h.cases.values()) >= CASES // 2, h.cases  # hypothesis ran them all (nearly)
    # most cases are refused, and by the checks behind the envelope, not only by it
    assert h.replies["InvalidArgumentError"] > CASES // 10
    assert h.replies["ok"] > CASES // 20
    assert h.still_serving()


_DEEP: object = 0
for _ in range(500):
    _DEEP = [_DEEP]

# name -> (request header, arrays, error code): malformed requests that reached internal
# errors before every field was checked against its operation's schema.
MALFORMED = {
    "table_name_is_a_list": ({"op": "info", "table": ["rows"]}, {}, 2),
    "table_name_is_a_map": ({"op": "reset", "table": {"a": 1}}, {}, 2),
    "count_is_a_map": ({"op": "can_insert", "table": "rows", "n": {"a": 1}}, {}, 2),
    "values_nested_500_deep": ({"op": "sample", "table": _DEEP, "batch_size": 1}, {}, 2),
    "id_nested_500_deep": ({"op": "ping", "id": _DEEP}, {}, 9),
    "op_nested_500_deep": ({"op": _DEEP}, {}, 9),
    "batch_size_a_float": ({"op": "sample", "table": "rows", "batch_size": 2.5}, {}, 2),
    "timeout_nan": ({"op": "sample", "table": "rows", "batch_size": 1, "timeout": math.nan}, {}, 2),
    "priority_a_string": ({"op": "insert", "table": "rows", "priority": "1"}, {}, 2),
    "noreply_a_string": ({"op": "ping", "noreply": "yes"}, {}, 9),
    "write_first_a_float": (
        {"op": "write", "writer": 1, "tables": ["seq"], "history": 3, "first": 0.5, "n": 0},
        {},
        9,
    ),
    "write_n_negative": (
        {"op": "write", "writer": 1, "tables": ["seq"], "history": 3, "first": 0, "n": -1},
        {},
        9,
    ),
    "keys_of_floats": ({"op": "delete", "table": "rows"}, {"keys": np.ones(2)}, 2),
    "unknown_array": ({"op": "reset", "table": "rows"}, {"extra": np.ones(2)}, 9),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_fields_get_typed_errors(harness, case):
    header, arrays, code = MALFORMED[case]
    before = harness.snapshot()
    if "id" in header:  # sent as it is: the reply cannot echo such an id
        harness.sock.send_multipart(codec.encode(dict(header), arrays))
        assert harness.sock.poll(5000)
        reply, _ = codec.decode(harness.sock.recv_multipart())
        assert reply["id"] is None
    else:
        rid = harness.send(codec.encode(dict(header), arrays))
        reply = harness._collect(rid).get(rid)
    assert reply is not None and reply["ok"] is False, reply
    assert reply["code"] == code, reply
    assert harness.snapshot() == before


def test_array_shapes_out_of_range_are_protocol_errors(harness):
    """A shape with a zero and a huge extent, too many dimensions, or an unaligned offset."""
    for shape, offset in (([0, 2**62], 0), ([1] * 40, 0), ([2**64 - 1], 0), ([1], 4)):
        head = {
            "v": 2,
            "id": 7,
            "op": "delete",
            "table": "rows",
            "arrays": [["keys", "<i8", shape, 1, offset]],
        }
        harness.sock.send_multipart([msgpack.packb(head), bytes(16)])
        assert harness.sock.poll(5000)
        reply, _ = codec.decode(harness.sock.recv_multipart())
        assert (reply["ok"], reply["code"], reply["id"]) == (False, 9, 7), reply


# name -> (shape, whether numpy can build it): shapes whose element counts or byte sizes
# are near and past the 64-bit limit. An extent of 0 makes the array empty, but numpy
# still refuses a shape whose other extents span more than 2**63 - 1 bytes.
SHAPES_NEAR_THE_LIMIT = {
    "three_extents_of_2**31_after_a_zero": ([0, 2**31, 2**31, 2**31], False),
    "2**63_bytes_of_int64_after_a_zero": ([0, 2**20, 2**20, 2**20], False),
    "2**62_bytes_of_int64_after_a_zero": ([0, 2**20, 2**20, 2**19], True),
    "2**80_elements_after_a_zero": ([0, 2**40, 2**40], False),
    "a_zero_last": ([2**40, 2**40, 0], False),
    "2**93_elements": ([2**31, 2**31, 2**31], False),
    "2**62_elements": ([2**31, 2**31], False),  # buildable, but not in 16 bytes
}


@pytest.mark.parametrize("op", ["insert", "update_priorities", "delete"])
@pytest.mark.parametrize("case", sorted(SHAPES_NEAR_THE_LIMIT))
def test_array_shapes_near_and_past_the_64_bit_limit_get_typed_errors(harness, op, case):
    """Counts and byte sizes are checked in Python ints before any array is built: a
    shape past the limit is a protocol error, one within it the operation's own typed
    error; never an internal error, and nothing changes."""
    shape, buildable = SHAPES_NEAR_THE_LIMIT[case]
    if op == "insert":
        names = ["data/obs", "data/step", "priorities"]
    else:
        names = ["keys", "priorities"] if op == "update_priorities" else ["keys"]
    entries = [[name, "<i8", [2], 1, 16 * i] for i, name in enumerate(names)]
    entries[0][2] = shape
    before = harness.snapshot()
    head = {"v": 2, "id": 8, "op": op, "table": "rows", "arrays": entries}
    harness.sock.send_multipart([msgpack.packb(head), bytes(16 * len(names))])
    assert harness.sock.poll(5000)
    reply, _ = codec.decode(harness.sock.recv_multipart())
    assert (reply["ok"], reply["id"]) == (False, 8), reply
    assert reply["code"] != codec.INTERNAL_ERROR, reply
    if not buildable:
        assert reply["code"] == codec.CODE_OF[ProtocolError], reply
    assert harness.snapshot() == before
    assert harness.still_serving()


@pytest.mark.parametrize("case", sorted(SHAPES_NEAR_THE_LIMIT))
def test_shared_memory_entries_near_and_past_the_64_bit_limit_are_checked(case):
    """The entries that place arrays in a shared-memory segment keep the same invariant."""
    shape, buildable = SHAPES_NEAR_THE_LIMIT[case]
    entry = ["data/obs", "<i8", shape, 0]
    if buildable and math.prod(shape) == 0:
        ((_, _, got, _, size),) = check_entries([entry], 64)
        assert (got, size) == (tuple(shape), 0)
        np.zeros(0, np.int64).reshape(got)  # numpy builds it
    else:
        with pytest.raises(ProtocolError, match="malformed shared-memory entry"):
            check_entries([entry], 64)


def test_a_header_too_deeply_nested_to_unpack_is_a_protocol_error(harness):
    harness.sock.send_multipart([b"\x91" * 3000 + b"\x00"])
    assert harness.sock.poll(5000)
    reply, _ = codec.decode(harness.sock.recv_multipart())
    assert (reply["ok"], reply["code"]) == (False, 9)
    assert harness.still_serving()


def test_stress_command_counts_and_writes_its_figures(tmp_path, capsys):
    import json

    from benchmarks import stress_wire

    stress_wire.main(["--cases", "200", "--seed", "3", "--out", str(tmp_path / "s.json")])
    result = json.loads((tmp_path / "s.json").read_text())
    assert sum(result["cases_by_kind"].values()) == 200
    assert sum(result["replies_by_kind"].values()) == 200
    assert result["internal_errors"] == 0 and result["tables_not_intact"] == 0
    assert result["still_serving"] and result["crashes"] == 0
    assert "internal_errors" in capsys.readouterr().out
