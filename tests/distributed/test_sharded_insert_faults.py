"""ShardedClient.insert against a stalled shard: the insert fails within its own timeout
(naming the shard), its rows are applied by no shard later, and the client goes on with
every shard once it answers again."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from shardprocs import shards, table, wait_until_stopped

from rlreplay.distributed import ShardedClient
from rlreplay.errors import ShardUnavailableError
from rlreplay.net import Client

CONFIG = {"table": [table("t")]}


def rows(n: int) -> dict[str, np.ndarray]:
    x = np.arange(n)
    return {"x": x, "obs": np.stack([x, x], 1).astype(np.float32)}


def test_an_insert_on_a_stalled_shard_fails_within_its_timeout_and_is_never_stored():
    with shards([CONFIG] * 3) as started:
        addresses = [a for a, _ in started]
        client = ShardedClient(addresses, first_shard=0, call_timeout=5.0)
        keys = [client.insert("t", rows(4)) for _ in range(3)]  # each shard holds 4 rows
        assert sorted(int(client.shard_of(k)[0]) for k in keys) == [0, 1, 2]
        stalled = started[0][1].pid
        os.kill(stalled, signal.SIGSTOP)
        try:
            wait_until_stopped(stalled)
            start = time.monotonic()
            with pytest.raises(ShardUnavailableError, match="shard 0") as raised:
                client.insert("t", rows(4), timeout=1.0)  # ties go to first_shard: shard 0
            assert raised.value.shard == 0
            # its timeout, the reply grace and the diagnosis, not call_timeout
            assert time.monotonic() - start < 1.0 + 0.5 + 1.5
            # the healthy shards take rows meanwhile
            for address in addresses[1:]:
                with Client(address) as other:
                    assert len(other.insert("t", rows(2))) == 2
        finally:
            os.kill(stalled, signal.SIGCONT)
        # the client goes on with every shard; the insert that raised is never stored
        keys = [client.insert("t", rows(4)) for _ in range(3)]
        assert [len(k) for k in keys] == [4, 4, 4]
        assert {int(client.shard_of(k)[0]) for k in keys} == {0, 1, 2}
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            with Client(addresses[0]) as first:
                assert first.info("t").size == 8
            time.sleep(0.2)
        client.close()
