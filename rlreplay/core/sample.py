"""What a sample returns: the items' data and the metadata a learner needs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlreplay.core.specs import unflatten
from rlreplay.errors import InvalidArgumentError, describe

NORMALIZATIONS = ("batch", "table", "none")


@dataclass
class SampleInfo:
    """Metadata of a sampled batch, one entry per sampled item.

    Attributes:
        keys: int64 item keys, for :meth:`Table.update_priorities` and :meth:`Table.delete`.
        probabilities: probability with which each item was selected in this draw.
        priorities: the items' priorities when sampled (1.0 if the table keeps none).
        times_sampled: how often each item has been sampled, this sample included.
        table_size: items in the table when the batch was drawn.
        min_probability: smallest selection probability of any item then in the table.
    """

    keys: np.ndarray
    probabilities: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    table_size: int
    min_probability: float

    def __repr__(self) -> str:
        arrays = ", ".join(
            f"{name}={_shape_of(getattr(self, name))}"
            for name in ("keys", "probabilities", "priorities", "times_sampled")
        )
        return (
            f"SampleInfo({arrays}, table_size={self.table_size}, "
            f"min_probability={self.min_probability:g})"
        )


def _shape_of(value: object) -> str:
    """``"float32[256, 4]"`` for an array (or tensor), the short repr of anything else."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return describe(value)
    name = getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
    return f"{name}{list(shape)}"


@dataclass
class Sample:
    """A batch of items: ``data`` maps each layout field to ``[B, ...]`` or ``[B, T, ...]``.

    Nested fields are keyed by path (``"obs/pos"``); :meth:`tree` gives the nest.

    Example:
        >>> batch = table.sample(256)                                # doctest: +SKIP
        >>> w = batch.importance_weights(beta=0.4)                   # doctest: +SKIP
        >>> table.update_priorities(batch.info.keys, new_priorities) # doctest: +SKIP
    """

    data: dict[str, np.ndarray]
    info: SampleInfo

    def __len__(self) -> int:
        return len(self.info.keys)

    def __repr__(self) -> str:
        """The fields' shapes and dtypes, never the arrays."""
        fields = ", ".join(f"{path!r}: {_shape_of(a)}" for path, a in self.data.items())
        return f"Sample({len(self)} items, data={{{fields}}}, info={self.info!r})"

    @property
    def keys(self) -> np.ndarray:
        return self.info.keys

    def tree(self) -> dict:
        """``data`` as nested dicts (``"obs/image"`` becomes ``["obs"]["image"]``)."""
        return unflatten(self.data)

    def importance_weights(self, beta: float, normalize: str = "batch") -> np.ndarray:
        """PER importance-sampling weights ``(N * P(i)) ** -beta``.

        Args:
            beta: exponent in ``[0, 1]``; 0 gives all ones, 1 fully corrects the bias.
            normalize: ``"batch"`` divides by the batch's largest weight; ``"table"`` by the
                largest any item could get, ``(N * P_min) ** -beta``; ``"none"``: raw.

        Returns:
            float64 weights, one per item (cast them to your loss's dtype).

        Raises:
            InvalidArgumentError: for ``beta`` outside ``[0, 1]`` or an unknown ``normalize``.
        """
        if not (isinstance(beta, (int, float)) and 0.0 <= beta <= 1.0):
            raise InvalidArgumentError(f"beta={describe(beta)} must be a number in [0, 1]")
        if normalize not in NORMALIZATIONS:
            raise InvalidArgumentError(
                f"normalize={normalize!r} is unknown; choose one of {NORMALIZATIONS}"
            )
        n = self.info.table_size
        weights = np.power(n * self.info.probabilities, -beta)
        if normalize == "batch":
            return weights / weights.max()
        if normalize == "table":
            return weights / np.power(n * self.info.min_probability, -beta)
        return weights
