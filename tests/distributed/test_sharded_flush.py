"""ShardedClient.flush: one deadline for all shards together, and every shard flushed even
when one of them fails."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from shardprocs import shards, table, wait_until_stopped

from rlreplay.distributed import ShardedClient
from rlreplay.errors import ReplayTimeoutError, ServerUnavailableError
from rlreplay.net import Client

CONFIG = {"table": [table("t")]}


def rows(n: int) -> dict[str, np.ndarray]:
    x = np.arange(n)
    return {"x": x, "obs": np.stack([x, x], 1).astype(np.float32)}


def test_a_stalled_shard_fails_the_flush_after_the_others_were_flushed():
    with shards([CONFIG] * 3) as started:
        addresses = [a for a, _ in started]
        client = ShardedClient(addresses, first_shard=0, call_timeout=5.0)
        for _ in range(3):  # each shard described and holding 4 rows
            client.insert("t", rows(4))
        stalled = started[0][1].pid
        os.kill(stalled, signal.SIGSTOP)
        try:
            wait_until_stopped(stalled)
            receipts = [client.insert("t", rows(4), wait=False) for _ in range(3)]
            assert sorted(r.shard for r in receipts) == [0, 1, 2]
            start = time.monotonic()
            with pytest.raises((ReplayTimeoutError, ServerUnavailableError)):
                client.flush(timeout=1.0)
            assert time.monotonic() - start < 2.5  # one deadline, not one per shard
            # the healthy shards' rows were sent and acknowledged all the same
            for address in addresses[1:]:
                with Client(address) as other:
                    assert other.info("t").size == 8
        finally:
            os.kill(stalled, signal.SIGCONT)
        receipts = [client.insert("t", rows(4), wait=False) for _ in range(3)]
        client.flush(timeout=20.0)  # the client goes on with every shard
        assert [len(r.keys(timeout=5.0)) for r in receipts] == [4, 4, 4]
        client.close()
