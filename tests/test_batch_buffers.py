"""Sampled batches of large items reuse the memory of dropped batches, never of held ones."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from rlreplay import ItemLayout, StepStore, Table
from rlreplay.core import item_draws
from rlreplay.core.batch_buffers import MIN_BYTES, BatchBuffers

FRAME = (64, 64)  # 4 KiB: a batch of 256 is 1 MiB, large enough to be kept


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


@pytest.fixture(params=["kernel", "numpy"])
def image_table(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setattr(item_draws, "_kernel", None)
    store = StepStore({"frame": (FRAME, "uint8"), "step": "int64"}, capacity=600)
    table = Table("images", store=store, layout=ItemLayout.transition(store.signature, ("frame",)))
    ids = np.arange(600)
    store.append(
        {
            "frame": np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None], (600, *FRAME)),
            "step": ids,
        }
    )
    table.create_items(np.arange(599))
    return table


def assert_batch_intact(batch) -> None:
    """Every frame still holds its own step's value (nothing wrote over it)."""
    steps = batch.data["step"]
    np.testing.assert_array_equal(batch.data["frame"][:, 0, 0], steps % 251)
    np.testing.assert_array_equal(batch.data["next_frame"][:, -1, -1], (steps + 1) % 251)


def test_a_held_batch_is_never_written_by_later_samples(image_table):
    held = image_table.sample(256)
    copy = {k: v.copy() for k, v in held.data.items()}
    for _ in range(10):
        later = image_table.sample(256)
        assert not np.shares_memory(later.data["frame"], held.data["frame"])
        assert_batch_intact(later)
    for name, value in copy.items():
        np.testing.assert_array_equal(held.data[name], value)


def test_a_view_of_a_dropped_batch_keeps_its_memory_from_reuse(image_table):
    batch = image_table.sample(256)
    first_frames = batch.data["frame"][:8]  # a view: the batch's array stays referenced
    expected = first_frames.copy()
    del batch
    gc.collect()
    for _ in range(6):
        image_table.sample(256)
    np.testing.assert_array_equal(first_frames, expected)


def test_the_memory_of_a_dropped_batch_is_reused(image_table):
    batch = image_table.sample(256)
    where = address(batch.data["frame"])
    del batch
    again = image_table.sample(256)
    assert address(again.data["frame"]) == where
    assert_batch_intact(again)


def test_small_arrays_are_not_kept():
    buffers = BatchBuffers()
    small = buffers.empty((MIN_BYTES - 1,), np.uint8)
    assert small.shape == (MIN_BYTES - 1,)
    assert not buffers._kept


def test_at_most_a_few_arrays_per_shape_are_kept():
    buffers = BatchBuffers()
    held = [buffers.empty((MIN_BYTES,), np.uint8) for _ in range(10)]
    assert len({address(a) for a in held}) == 10
    assert sum(len(v) for v in buffers._kept.values()) <= 4
