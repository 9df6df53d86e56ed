"""Several inserting and sampling threads against one SampleToInsertRatio table."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import numpy as np
from conftest import Worker, assert_rows_consistent, rows

from rlreplay import Prioritized, RateLimiterTimeoutError, SampleToInsertRatio

SPI, MIN_SIZE, ERROR_BUFFER = 2.0, 20, 40.0  # min_diff 0, max_diff 80
INSERTERS, ROWS_EACH, INSERT_BATCH = 3, 600, 5
SAMPLERS, SAMPLE_BATCH = 3, 8
DEADLINE_S = 30.0  # far above the ~2 s this takes; a deadlock fails the join instead of hanging


def test_inserters_and_samplers_keep_the_ratio_and_lose_nothing(make_table):
    total = INSERTERS * ROWS_EACH
    table = make_table(
        max_size=total,
        capacity=total,
        sampler=Prioritized(0.6),
        rate_limiter=SampleToInsertRatio(SPI, MIN_SIZE, ERROR_BUFFER),
        seed=0,
    )
    limiter = table.rate_limiter
    stop = threading.Event()
    inserted: list[list[tuple[int, int]]] = [[] for _ in range(INSERTERS)]
    sampled: list[list] = [[] for _ in range(SAMPLERS)]
    deleted = [0] * SAMPLERS
    diffs: list[float] = []

    def insert(i):
        base = i * 1_000_000
        for k in range(0, ROWS_EACH, INSERT_BATCH):
            first = base + k
            keys = table.insert(rows(first, INSERT_BATCH), timeout=10.0)
            inserted[i].extend(zip(keys.tolist(), range(first, first + INSERT_BATCH)))

    def sample(i):
        rng = np.random.default_rng(i)
        while not stop.is_set():
            try:
                batch = table.sample(SAMPLE_BATCH, timeout=0.1)
            except RateLimiterTimeoutError:
                continue
            sampled[i].append(batch)
            table.update_priorities(batch.info.keys, rng.uniform(0.1, 2.0, len(batch)))
            if rng.random() < 0.05:
                deleted[i] += table.delete(batch.info.keys[:1])

    def watch():
        while not stop.is_set():
            with table.mutex:
                diffs.append(limiter.inserts * SPI - limiter.samples)
            time.sleep(0.002)

    inserters = [Worker(lambda i=i: insert(i)) for i in range(INSERTERS)]
    samplers = [Worker(lambda i=i: sample(i)) for i in range(SAMPLERS)]
    watcher = Worker(watch)
    for w in [*inserters, *samplers, watcher]:
        w.start()
    start = time.monotonic()
    try:
        for w in inserters:
            w.finish(timeout=max(0.1, DEADLINE_S - (time.monotonic() - start)))
        # Let the samplers drain what the limiter still admits.
        while table.can_sample(SAMPLE_BATCH) and time.monotonic() - start < DEADLINE_S:
            time.sleep(0.01)
    finally:
        stop.set()
        for w in [*samplers, watcher]:
            w.finish(timeout=5.0)

    # No lost or duplicated items: every insert got its own key, every key one step.
    pairs = [p for part in inserted for p in part]
    assert len(pairs) == total
    step_of = dict(pairs)
    assert len(step_of) == total and len(set(step_of.values())) == total

    # Every sampled row is an inserted row, served under the key it was inserted with.
    draws = defaultdict(list)
    n_sampled = 0
    for batch in (b for part in sampled for b in part):
        assert_rows_consistent(batch.data)
        for key, s, t in zip(
            batch.info.keys.tolist(), batch.data["step"].tolist(), batch.info.times_sampled
        ):
            assert step_of[key] == s
            draws[key].append(int(t))
        n_sampled += len(batch)
    # times_sampled counted every draw exactly once, even across threads.
    for key, counts in draws.items():
        assert sorted(counts) == list(range(1, len(counts) + 1)), key

    # Counters agree with what the threads saw.
    info = table.info()
    assert info.inserts == total
    assert info.samples == n_sampled
    assert info.deletes == sum(deleted)
    assert info.size == total - sum(deleted)
    assert info.evictions == info.overwrite_evictions == 0

    # The ratio stayed within the error buffer the whole time and at the end.
    lo, hi = limiter.min_diff, limiter.max_diff
    assert diffs and min(diffs) >= lo and max(diffs) <= hi
    assert lo <= info.inserts * SPI - info.samples <= hi
    assert n_sampled >= total * SPI - hi


def test_queue_with_several_producers_and_consumers_serves_each_item_once_in_order():
    from rlreplay import Table

    table = Table.queue("q", 16, signature={"step": "int64", "obs": ((3,), "float32")})
    producers, per_producer = 2, 400
    consumed: list[list[int]] = [[], []]
    stop = threading.Event()

    def produce(i):
        for k in range(per_producer):
            table.insert(rows(i * 1_000_000 + k, 1), timeout=10.0)

    def consume(i):
        while not stop.is_set():
            try:
                consumed[i].extend(table.sample(1, timeout=0.05).data["step"].tolist())
            except RateLimiterTimeoutError:
                continue

    workers = [Worker(lambda i=i: produce(i)) for i in range(producers)]
    consumers = [Worker(lambda i=i: consume(i)) for i in range(2)]
    for w in [*workers, *consumers]:
        w.start()
    start = time.monotonic()
    try:
        for w in workers:
            w.finish(timeout=DEADLINE_S)
        while table.size and time.monotonic() - start < DEADLINE_S:
            time.sleep(0.01)
    finally:
        stop.set()
        for w in consumers:
            w.finish(timeout=5.0)
    everything = sorted(consumed[0] + consumed[1])
    expected = sorted(i * 1_000_000 + k for i in range(producers) for k in range(per_producer))
    assert everything == expected  # each item exactly once
    for seen in consumed:  # FIFO: each consumer sees each producer's items in order
        for i in range(producers):
            mine = [s for s in seen if s // 1_000_000 == i]
            assert mine == sorted(mine)
    info = table.info()
    assert info.inserts == info.samples == producers * per_producer and info.size == 0
