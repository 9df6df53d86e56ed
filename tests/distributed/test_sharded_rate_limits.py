"""Per-shard rate limiters compose into one global samples-per-insert ratio, also when
one writer is much faster than another."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
from shardprocs import shards, table

from rlreplay.distributed import ShardedClient
from rlreplay.errors import RateLimiterTimeoutError

SPI = 2.0
LIMITER = {"type": "SampleToInsertRatio", "samples_per_insert": SPI,
           "min_size_to_sample": 10, "error_buffer": 40.0}
CONFIG = {"table": [table("replay", max_size=100, rate_limiter=LIMITER)]}


def test_uneven_writers_hold_the_global_ratio_within_ten_percent():
    with shards([CONFIG, CONFIG]) as started:
        addresses = [a for a, _ in started]
        stop = threading.Event()
        errors: list[BaseException] = []

        def write(shard: int, pause: float) -> None:
            client = ShardedClient(addresses, first_shard=shard)
            w = client.trajectory_writer("replay", shard=shard, chunk_steps=5)
            try:
                for i in range(100_000):
                    if stop.is_set():
                        break
                    w.append({"x": np.int64(i), "obs": np.zeros(2, np.float32)}, timeout=0.2)
                    w.create_item("replay", timeout=0.2)
                    time.sleep(pause)
            except RateLimiterTimeoutError:
                pass  # its shard holds it back: the learner has not caught up
            except BaseException as error:
                errors.append(error)
            finally:
                with contextlib.suppress(RateLimiterTimeoutError):  # its last chunk waits
                    w.close(timeout=0.1)
                client.close()

        def learn() -> None:
            client = ShardedClient(addresses, seed=0)
            try:
                with client.sample_iterator("replay", 16, in_flight=2, timeout=0.3) as it:
                    while not stop.is_set():
                        try:
                            next(it)
                        except RateLimiterTimeoutError:
                            it.close()
            except BaseException as error:
                errors.append(error)

        # writer 0 appends about 6 times as fast as writer 1, each on its own shard
        threads = [
            threading.Thread(target=write, args=(0, 0.0005)),
            threading.Thread(target=write, args=(1, 0.003)),
            threading.Thread(target=learn),
        ]
        for t in threads:
            t.start()
        time.sleep(4.0)
        stop.set()
        for t in threads:
            t.join(20.0)
        assert not errors, errors
        infos = ShardedClient(addresses).shard_info("replay")
        inserts = [i.inserts for i in infos.values()]
        samples = [i.samples for i in infos.values()]
        assert min(inserts) >= 50, inserts
        ratio = sum(samples) / sum(inserts)
        assert abs(ratio - SPI) <= 0.1 * SPI, (inserts, samples)
        for i, s in zip(inserts, samples):  # each shard's own limiter held it too
            assert abs(s / i - SPI) <= 0.1 * SPI, (inserts, samples)


# Inserts are never held back here (the buffer is larger than any test's inserts), and a
# shard with 50 items admits samples while samples <= 50 + 99.
ROOMY = {"type": "SampleToInsertRatio", "samples_per_insert": 1.0, "min_size_to_sample": 1,
         "error_buffer": 100.0}


def test_a_shard_whose_credit_cannot_cover_a_batch_gets_no_part_of_it():
    # Shard 0's writers finished: it still has a little credit (3 items), far from its
    # part of a batch of 16. The batch is drawn from shard 1 at once, with shard 1's
    # probabilities, instead of holding shard 0's part back for the whole timeout.
    config = {"table": [table("replay", max_size=100, rate_limiter=ROOMY)]}
    with shards([config, config]) as started:
        addresses = [a for a, _ in started]
        client = ShardedClient(addresses, seed=0)
        for shard in (0, 1):
            rows = {"x": np.arange(50), "obs": np.zeros((50, 2), np.float32)}
            client.shards[shard].insert("replay", rows, 1.0)
        for _ in range(3):  # 146 of shard 0's 149 admitted samples, through its own client
            client.shards[0].sample("replay", 50 if _ < 2 else 46, timeout=1.0)
        assert client.can_sample("replay", 16)
        start = time.monotonic()
        for _ in range(5):
            batch = client.sample("replay", 16, timeout=0.5)
            assert set(client.shard_of(batch.info.keys).tolist()) == {1}
            np.testing.assert_allclose(batch.info.probabilities, 1 / 50)
        assert time.monotonic() - start < 2.0  # no part waited for its timeout
        assert [i.samples for i in client.shard_info("replay").values()] == [146, 80]
        client.close()
