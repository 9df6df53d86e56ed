"""Prefetching iterator and the single-threaded learn helper."""

from __future__ import annotations

import sys
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
        pytest.param({"batch_size": 0}, id="batch_size_zero"),
        pytest.param({"batch_size": -3}, id="batch_size_negative"),
        pytest.param({"batch_size": 2.0}, id="batch_size_float"),
        pytest.param({"batch_size": "4"}, id="batch_size_str"),
        pytest.param({"batch_size": True}, id="batch_size_bool"),
        pytest.param({"table": "replay"}, id="table_name_not_a_table"),
        pytest.param({"table": {"obs": np.zeros((4, 4))}}, id="table_a_dict"),
    ],
)
def test_bad_iterator_arguments_raise_at_construction(kwargs):
    kwargs = {"table": filled_table(), "batch_size": 4, **kwargs}
    threads = threading.active_count()
    with pytest.raises(InvalidArgumentError) as caught:
        ReplayIterator(**kwargs)
    assert "\n" not in str(caught.value)
    assert threading.active_count() == threads  # no sampling thread was started


def test_a_numpy_integer_batch_size_is_accepted():
    with ReplayIterator(filled_table(), np.int64(4), timeout=5.0, max_batches=1) as it:
        assert next(it).data["reward"].shape == (4,)


@pytest.mark.parametrize(
    "output, words",
    [
        pytest.param("jax", ["output='jax'", "pip install jax"], id="jax"),
        pytest.param("torch", ["output='torch'", "pip install torch"], id="torch"),
    ],
)
def test_an_output_framework_that_is_not_installed_is_refused_with_the_install_command(
    monkeypatch, output, words
):
    monkeypatch.setitem(sys.modules, output, None)  # import fails as if not installed
    with pytest.raises(InvalidArgumentError) as caught:
        ReplayIterator(filled_table(), 4, output=output)
    for word in words:
        assert word in str(caught.value)


def _without_accelerator():
    torch = pytest.importorskip("torch")
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if torch.cuda.is_available() or (accelerator is not None and accelerator.is_available()):
        pytest.skip("needs a torch without an accelerator")
    return torch


@pytest.mark.parametrize(
    "kwargs, words",
    [
        pytest.param({"device": "cuda"}, ["device='cuda'", "leave device out"], id="cuda"),
        pytest.param({"device": "cuda:1"}, ["device='cuda:1'"], id="cuda_ordinal"),
        pytest.param({"device": "gpu"}, ["device='gpu'"], id="unknown_device_name"),
        pytest.param(
            {"pin_memory": True}, ["pin_memory=True", "leave pin_memory out"], id="pin_memory"
        ),
        pytest.param(
            {"device": "cuda", "pin_memory": True}, ["device='cuda'"], id="cuda_and_pin_memory"
        ),
    ],
)
def test_torch_device_options_this_machine_cannot_use_are_refused_at_construction(kwargs, words):
    _without_accelerator()
    threads = threading.active_count()
    with pytest.raises(InvalidArgumentError) as caught:
        ReplayIterator(filled_table(), 4, output="torch", **kwargs)
    for word in words:
        assert word in str(caught.value)
    assert threading.active_count() == threads


def test_torch_on_the_cpu_device_named_explicitly_still_works():
    torch = pytest.importorskip("torch")
    with ReplayIterator(
        filled_table(), 4, output="torch", device="cpu", timeout=5.0, max_batches=1
    ) as it:
        assert next(it).data["obs"].device == torch.device("cpu")


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


@pytest.mark.parametrize(
    "kwargs, words",
    [
        pytest.param({"batch_size": 0}, ["batch_size=0"], id="batch_size_zero"),
        pytest.param({"batch_size": 2.5}, ["batch_size=2.5"], id="batch_size_float"),
        pytest.param({"batch_size": True}, ["batch_size=True"], id="batch_size_bool"),
        pytest.param({"table": 3}, ["table=3"], id="table_not_a_name"),
        pytest.param({"table": ""}, ["table=''"], id="table_empty"),
        pytest.param({"timeout": 0}, ["timeout=0"], id="timeout_zero"),
        pytest.param({"timeout": "5"}, ["timeout='5'"], id="timeout_str"),
        pytest.param({"in_flight": 0}, ["in_flight=0"], id="in_flight_zero"),
    ],
)
def test_remote_sample_iterator_checks_its_arguments_at_construction(kwargs, words):
    pytest.importorskip("zmq")
    from rlreplay.net.client.iterator import SampleIterator

    kwargs = {"table": "replay", "batch_size": 4, **kwargs}
    table, batch_size = kwargs.pop("table"), kwargs.pop("batch_size")
    with pytest.raises(InvalidArgumentError) as caught:
        SampleIterator(object(), table, batch_size, **kwargs)  # the client is never used
    for word in words:
        assert word in str(caught.value)


def test_close_from_another_thread_ends_a_next_waiting_for_a_batch():
    table = Table("t", signature=SIG, max_size=16, rate_limiter=MinSize(10))  # stays empty
    it = ReplayIterator(table, 4)
    outcome: list = []

    def consume() -> None:
        try:
            next(it)
        except BaseException as error:
            outcome.append(error)

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.2)
    it.close()
    consumer.join(5)
    assert not consumer.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], StopIteration)
