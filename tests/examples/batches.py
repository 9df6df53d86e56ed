"""Hand-made batches for the example learners' unit tests."""

from __future__ import annotations

import numpy as np

from rlreplay import Sample, SampleInfo


def uniform_sample(data: dict[str, np.ndarray]) -> Sample:
    """``data`` as a batch a uniform table of ``len(batch)`` items would serve, stamped
    with policy version 0."""
    size = len(next(iter(data.values())))
    info = SampleInfo(
        keys=np.arange(size, dtype=np.uint64),
        probabilities=np.full(size, 1.0 / size),
        table_size=size,
        priorities=np.ones(size),
        times_sampled=np.ones(size, np.int64),
        min_probability=1.0 / size,
    )
    return Sample({**data, "policy_version": np.zeros(size, np.int64)}, info)
