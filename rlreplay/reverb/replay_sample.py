"""What Reverb's sample calls return: ``ReplaySample(info, data)`` and its ``SampleInfo``."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["ReplaySample", "SampleInfo"]


class SampleInfo(NamedTuple):
    """Details of a sampled item (Python scalars from ``Client.sample``, arrays with a
    leading batch axis from a batched dataset).

    Fields:
        key: the item's key (for ``mutate_priorities``), an unsigned 64-bit integer.
        probability: probability with which the item was selected.
        table_size: items in the table when it was sampled.
        priority: the item's priority when sampled.
        times_sampled: times the item has been sampled, this time included.
    """

    key: Any
    probability: Any
    table_size: Any
    priority: Any
    times_sampled: Any

    @classmethod
    def tf_dtypes(cls) -> SampleInfo:
        """numpy dtypes of the fields (Reverb gives TensorFlow's equivalents)."""
        return cls(
            np.dtype(np.uint64),
            np.dtype(np.float64),
            np.dtype(np.int64),
            np.dtype(np.float64),
            np.dtype(np.int32),
        )

    @classmethod
    def tf_shapes(cls) -> SampleInfo:
        return cls((), (), (), (), ())

    @classmethod
    def zeros(cls) -> SampleInfo:
        return cls(0, 0.0, 0, 0.0, 0)


class ReplaySample(NamedTuple):
    """A sampled item (or batch): ``info`` and ``data``, nested as the table's signature
    when it is known and asked for, else a flat list of columns."""

    info: SampleInfo
    data: Any
