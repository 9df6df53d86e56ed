"""Prefetching iterator and the single-threaded learn helper."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rlreplay import (
    InvalidArgumentError,
    MinSize,
    ReplayIterator,
    ReplayTimeoutError,
    SampleToInsertRatio,
    Table,
    learn_while_can_sample,
)

SIG = {"obs": ((4,), "float32"), "reward": "float32"}


def filled_table(n: int = 64, **kwargs) -> Table:
    table = Table("t", signature=SIG, max_size=256, seed=0, **kwargs)
    obs = np.repeat(np.arange(n, dtype=np.float32)[:, None], 4, axis=1)
    table.insert({"obs": obs, "reward": np.arange(n, dtype=np.float32)})
    return table


def test_iterator_yields_consistent_batches_and_stops_after_max_batches():
    table = filled_table()
    with ReplayIterator(table, 16, prefetch=3, timeout=5.0, max_batches=5) as it:
        batches = list(it)
    assert len(batches) == 5
    for b in batches:
        assert b.data["obs"].shape == (16, 4)
        np.testing.assert_array_equal(b.data["obs"][:, 0], b.data["reward"])
    assert not it._thread.is_alive()


def test_close_stops_the_thread_while_it_waits_for_an_empty_table():
    table = Table("t", signature=SIG, max_size=64)
    it = ReplayIterator(table, 4, prefetch=2)
    time.sleep(0.1)
    it.close(timeout=2.0)
    assert not it._thread.is_alive()
    with pytest.raises(StopIteration):
        next(it)


def test_next_times_out_and_records_the_wait_then_gets_data_once_inserted():
    table = Table("t", signature=SIG, max_size=64, rate_limiter=MinSize(8))
    with ReplayIterator(table, 4, timeout=0.2) as it:
        with pytest.raises(ReplayTimeoutError):
            next(it)
        assert it.wait_s >= 0.2
        inserter = threading.Timer(
            0.1, lambda: table.insert({"obs": np.ones((8, 4)), "reward": np.ones(8)})
        )
        inserter.start()
        it.timeout = 5.0
        batch = next(it)
        inserter.join()
    assert batch.data["reward"].shape == (4,)


def test_errors_in_the_sampling_thread_reach_the_learner():
    table = filled_table()
    with ReplayIterator(table, 10_000, timeout=5.0) as it, pytest.raises(InvalidArgumentError):
        next(it)


def test_torch_output_is_zero_copy_on_cpu():
    torch = pytest.importorskip("torch")
    table = filled_table()
    with ReplayIterator(table, 8, output="torch", timeout=5.0, max_batches=1) as it:
        batch = next(it)
    assert isinstance(batch.data["obs"], torch.Tensor)
    assert batch.data["obs"].dtype == torch.float32
    np.testing.assert_array_equal(batch.data["obs"][:, 0].numpy(), batch.data["reward"].numpy())
    assert isinstance(batch.info.keys, np.ndarray)


def test_jax_output_when_available():
    jax = pytest.importorskip("jax")
    table = filled_table()
    with ReplayIterator(table, 8, output="jax", timeout=5.0, max_batches=1) as it:
        batch = next(it)
    assert isinstance(batch.data["obs"], jax.Array)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"output": "tensorflow"}, id="unknown_output"),
        pytest.param({"prefetch": 0}, id="prefetch_zero"),
        pytest.param({"timeout": -1}, id="negative_timeout"),
        pytest.param({"pin_memory": True}, id="pin_without_torch"),
    ],
)
def test_bad_iterator_arguments_raise(kwargs):
    with pytest.raises(InvalidArgumentError):
        ReplayIterator(filled_table(), 4, **kwargs)


def test_learn_helper_follows_the_rate_limiter_and_never_blocks():
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=8, error_buffer=16)
    table = Table("t", signature=SIG, max_size=256, rate_limiter=limiter)
    seen = []
    assert learn_while_can_sample(table, 4, seen.append, max_batches=100) == 0
    total = 0
    for step in range(50):
        table.insert({"obs": np.full((1, 4), step), "reward": np.ones(1)})
        total += learn_while_can_sample(table, 1, seen.append, max_batches=100)
    assert total == len(seen) > 0
    assert table.rate_limiter.samples <= 2.0 * table.rate_limiter.inserts + 16


def test_learn_helper_is_bounded_by_max_batches_under_min_size():
    table = filled_table()
    assert learn_while_can_sample(table, 4, lambda b: None, max_batches=7) == 7
    with pytest.raises(InvalidArgumentError):
        learn_while_can_sample(table, 4, lambda b: None, max_batches=-1)


def test_prefetch_keeps_that_many_batches_ready_and_no_more():
    table = filled_table()
    with ReplayIterator(table, 8, prefetch=3, timeout=5.0) as it:
        deadline = time.monotonic() + 5.0
        while it._queue.qsize() < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert it._queue.qsize() == 3
        # three queued plus at most one sampled and waiting to be queued
        assert 3 * 8 <= table.rate_limiter.samples <= 4 * 8
        next(it)


def test_torch_output_on_a_cuda_device_with_pinned_memory():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    table = filled_table()
    with ReplayIterator(
        table, 8, output="torch", device="cuda", pin_memory=True, timeout=10.0, max_batches=1
    ) as it:
        batch = next(it)
    assert batch.data["obs"].device.type == "cuda"
