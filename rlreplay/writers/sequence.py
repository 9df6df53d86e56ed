"""Fixed-length sequences and whole episodes from one or many environments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.layout import ItemLayout, Window
from rlreplay.core.specs import Signature, checked_extras
from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.writers.sequence_items import SequenceItems
from rlreplay.writers.stream import StreamAdder


class SequenceAdder(StreamAdder):
    """Adds windows of ``burn_in + length`` consecutive episode rows every ``period`` rows.

    Rows hold ``obs_t, action_t, reward_t, discount_t`` and extras, plus a final row with
    ``obs_T``; ``discount_t`` is ``discount``, 0 for the terminal step and final row. Windows
    never cross an episode boundary; the first ``burn_in`` rows are for recurrent warm-up.

    Args:
        writer: writer, table or tables (see :class:`StreamAdder`).
        length: rows a learner trains on per item.
        period: rows between window starts (``period < length`` overlaps windows).
        burn_in: extra rows before the ``length`` training rows.
        pad_end: zero-pad windows running past the final row (``mask`` marks real rows), or
            drop them.
        discount: value of ``discount_t`` for non-terminal steps.
        **kwargs: as for :class:`StreamAdder`.

    Raises:
        InvalidArgumentError: for bad ``length``, ``period``, ``burn_in`` or ``discount``.
    """

    # With pad_end, also a window starting at the final row (see SequenceItems).
    keep_final_row = False

    computed = ("discount",)

    def __init__(
        self,
        writer: Any,
        length: int,
        period: int,
        *,
        burn_in: int = 0,
        pad_end: bool = True,
        discount: float = 1.0,
        **kwargs: Any,
    ):
        if isinstance(discount, bool) or not isinstance(discount, (int, float, np.number)):
            raise InvalidArgumentError(f"discount={describe(discount)} must be a number in [0, 1]")
        if not 0.0 <= discount <= 1.0:
            raise InvalidArgumentError(f"discount={describe(discount)} must be in [0, 1]")
        self.rule = SequenceItems(
            length, period, burn_in, pad_end, keep_final_row=self.keep_final_row
        )
        self.length, self.period, self.burn_in = length, period, burn_in
        self.pad_end = bool(pad_end)
        self.discount = float(discount)
        self.span = burn_in + length
        self.lag = 2  # complete once the episode went on past its step
        self.pad = 0
        super().__init__(writer, **kwargs)
        self.rule.bind(self.num_envs)

    @staticmethod
    def signature(
        obs: Any,
        action: Any,
        extras: Mapping[str, Any] | None = None,
        reward: Any = "float32",
    ) -> Signature:
        """Stored step signature: ``obs``, ``action``, ``reward``, extras, ``discount`` (specs may
        be gymnasium spaces)."""
        extras = checked_extras(extras, ("obs", "action", "reward", "discount"), "SequenceAdder")
        fields = {"obs": obs, "action": action, "reward": reward, **extras}
        fields["discount"] = "float32"
        return Signature(fields)

    @staticmethod
    def layout(
        signature: Signature | Mapping, length: int, burn_in: int = 0, pad_end: bool = True
    ) -> ItemLayout:
        """Every column as ``[B, burn_in + length, ...]``, plus ``mask`` when padding."""
        sig = Signature(signature)
        size = burn_in + length
        windows = {p: Window(p, 0, size, pad=pad_end) for p in sig.paths}
        return ItemLayout(windows, sig, mask_field="mask" if pad_end else None)

    def _computed(
        self, i: int, lo: int, hi: int, ended: bool, terminated: bool, out: dict[str, np.ndarray]
    ) -> None:
        t = np.arange(lo, hi)
        total = int(self._steps[i])
        disc = np.full(len(t), self.discount, dtype=np.float32)
        if ended:
            disc[t >= total] = 0.0
            if terminated:
                disc[t == total - 1] = 0.0
        out["discount"][...] = disc

    def _items(
        self, i: int, appended: int, ended: bool, terminated: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        return self.rule.items(i, appended, 0, int(self._steps[i]), ended)


class EpisodeAdder(SequenceAdder):
    """Adds each whole episode as one item, zero-padded to ``max_length`` rows with a mask.

    An episode of ``T`` steps has ``T + 1`` rows; items are ``[B, max_length, ...]`` per
    column plus ``mask``. A longer episode becomes consecutive items of ``max_length`` rows,
    each row in exactly one. Use :meth:`layout` for its tables.

    Args:
        writer: writer, table or tables (see :class:`StreamAdder`).
        max_length: most rows of one item.
        **kwargs: ``discount`` and the :class:`StreamAdder` options.
    """

    keep_final_row = True

    def __init__(self, writer: Any, max_length: int, **kwargs: Any):
        super().__init__(writer, max_length, max_length, pad_end=True, **kwargs)

    @staticmethod
    def layout(  # type: ignore[override]
        signature: Signature | Mapping, max_length: int
    ) -> ItemLayout:
        """Every column as ``[B, max_length, ...]`` zero-padded, plus ``mask``."""
        return SequenceAdder.layout(signature, max_length, 0, True)
