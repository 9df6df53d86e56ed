"""A shard that answers a sample only after the sharded client stopped waiting draws
nothing for it: the request carries the client's deadline, so the items are neither
counted as sampled there nor lost on the way (a stalled server process, resumed)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
from shardprocs import shards, table, wait_until_stopped

from rlreplay.distributed import ShardedClient
from rlreplay.errors import ReplayTimeoutError
from rlreplay.net import Client

CONFIG = {"table": [table("t")]}
# Liveness far beyond the sample's deadline: the stalled shard is waited for until the
# deadline, not declared down.
OPTIONS = {"call_timeout": 10.0, "liveness_s": 30.0}


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    x = np.arange(first, first + n)
    return {"x": x, "obs": np.stack([x, x], 1).astype(np.float32)}


def samples_of(address: str) -> int:
    with Client(address, call_timeout=10.0) as client:
        return client.info("t").samples


def test_a_shard_resumed_after_the_deadline_draws_nothing_for_the_expired_request():
    with shards([CONFIG, CONFIG]) as started:
        addresses = [a for a, _ in started]
        stalled = started[1][1]
        client = ShardedClient(addresses, first_shard=0, **OPTIONS)
        try:
            for i in range(2):
                client.insert("t", rows(10 * i, 10))
            client.sample("t", 16, timeout=5.0)  # both shards greeted
            before = samples_of(addresses[1])
            os.kill(stalled.pid, signal.SIGSTOP)
            try:
                # kill only queues the signal: a loaded machine may let the shard answer
                # the next calls first, which would then be served in time
                wait_until_stopped(stalled.pid)
                start = time.monotonic()
                try:
                    for _ in range(3):  # enough calls that shard 1 is asked for items
                        client.sample("t", 16, timeout=0.5)
                except ReplayTimeoutError:
                    pass
                assert time.monotonic() - start < 8.0
                time.sleep(0.3)  # every request to shard 1 is past its deadline now
            finally:
                os.kill(stalled.pid, signal.SIGCONT)
            time.sleep(1.0)  # the resumed shard works its queue (milliseconds)
            after = samples_of(addresses[1])
            assert after == before, (before, after)
        finally:
            client.close()
