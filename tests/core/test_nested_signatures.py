"""A nested signature (``{"obs": {"image": ...}}``) survives its JSON form and accepts
its own flat output, so it works through a server as well as in process."""

from __future__ import annotations

import numpy as np
import pytest

import rlreplay as rr
from rlreplay import Signature

NESTED = {"obs": {"image": ((2, 2), "uint8"), "speed": "float32"}, "reward": "float32"}


def rows(n: int, value: int) -> dict:
    return {
        "obs": {"image": np.full((n, 2, 2), value, np.uint8), "speed": np.full(n, value, "f4")},
        "reward": np.full(n, value, np.float32),
    }


def test_a_nested_signature_is_rebuilt_from_its_json_form():
    sig = Signature(NESTED)
    assert sig.paths == ("obs/image", "obs/speed", "reward")
    assert Signature.from_json(sig.to_json()) == sig


ONE_STEP = {"obs": {"image": np.ones((2, 2), np.uint8), "speed": 1.0}, "reward": 1.0}

# (check, data it is given first): the check must accept its own flat output again
CHECKS = [
    pytest.param(lambda sig, d: sig.check_batch(d, "rows")[0], rows(3, 1), id="check_batch"),
    pytest.param(lambda sig, d: sig.check_step(d), ONE_STEP, id="check_step"),
    pytest.param(lambda sig, d: sig.check_row(d, "step"), ONE_STEP, id="check_row"),
]


@pytest.mark.parametrize("check, data", CHECKS)
def test_checked_data_is_accepted_again_in_its_flat_form(check, data):
    sig = Signature(NESTED)
    flat = check(sig, data)
    assert list(flat) == list(sig.paths)
    again = check(sig, dict(flat))
    for path in sig.paths:
        np.testing.assert_array_equal(again[path], flat[path])


def test_a_table_of_nested_signature_is_served_inserted_and_sampled():
    pytest.importorskip("zmq")
    table = rr.Table("t", signature=NESTED, max_size=16, seed=0)
    table.insert(rows(2, 1))
    with rr.Server([table]) as server:
        client = rr.Client(server.address, call_timeout=10.0)
        try:
            assert client.signature("t") == table.store.signature
            client.insert("t", rows(2, 7), timeout=5.0)
            batch = client.sample("t", 8, timeout=5.0)
        finally:
            client.close()
    assert table.size == 4
    assert set(batch.data) == {"obs/image", "obs/speed", "reward"}
    assert batch.data["obs/image"].shape == (8, 2, 2)
    np.testing.assert_array_equal(batch.data["obs/image"][:, 0, 0], batch.data["reward"])
