"""Where sequence items start and end within an episode's rows (shared by the adders)."""

from __future__ import annotations

import numpy as np

from rlreplay.errors import InvalidArgumentError, describe


class SequenceItems:
    """Windows of ``burn_in + length`` episode rows starting every ``period`` rows.

    Used by :class:`~rlreplay.writers.SequenceAdder` and by any adder's ``sequence_tables``.
    Windows start at the episode's first step row and never cross its final row.

    Args:
        length: rows a learner trains on per item.
        period: rows between window starts.
        burn_in: extra rows before the ``length`` rows.
        pad_end: also add shortened windows at episode end (holding a step besides the final
            row); ``False`` drops them.
        keep_final_row: with ``pad_end``, also a window starting at the final row.

    Raises:
        InvalidArgumentError: for bad ``length``, ``period`` or ``burn_in``.
    """

    def __init__(
        self,
        length: int,
        period: int,
        burn_in: int = 0,
        pad_end: bool = True,
        *,
        keep_final_row: bool = False,
    ):
        for name, value, low in (
            ("length", length, 1),
            ("period", period, 1),
            ("burn_in", burn_in, 0),
        ):
            if not isinstance(value, int) or value < low:
                raise InvalidArgumentError(f"{name}={describe(value)} must be an int >= {low}")
        self.length, self.period, self.burn_in = length, period, burn_in
        self.pad_end = bool(pad_end)
        self.keep_final_row = bool(keep_final_row) and self.pad_end
        self.span = burn_in + length
        self._next = np.zeros(1, dtype=np.int64)

    def bind(self, num_envs: int) -> None:
        """Keep one next-start position per environment."""
        self._next = np.zeros(num_envs, dtype=np.int64)

    def items(
        self, i: int, appended: int, first_row: int, steps: int, ended: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Anchor rows and extents of the windows of env ``i`` creatable now.

        Args:
            i: environment index.
            appended: episode rows appended so far.
            first_row: row of the episode's first step.
            steps: steps in the episode so far.
            ended: whether the episode ended (its final row is appended).
        """
        first = first_row + int(self._next[i])
        size = self.span
        if ended:
            rows = first_row + steps + 1
            if not self.pad_end:
                last = rows - size
            elif self.keep_final_row and steps > 0:
                last = rows - 1
            else:
                last = rows - 2
        else:
            last = appended - size
        if last >= first:
            starts = np.arange(first, last + 1, self.period, dtype=np.int64)
        else:
            starts = np.zeros(0, dtype=np.int64)
        extent = np.minimum(size, appended - starts)
        if ended:
            self._next[i] = 0
        elif len(starts):
            self._next[i] = starts[-1] + self.period - first_row
        return starts, extent.astype(np.int64)
