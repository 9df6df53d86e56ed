"""N-step transitions (optionally over stacked frames) from one or many environments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlreplay.core.layout import ItemLayout, Window
from rlreplay.core.specs import Signature, checked_extras
from rlreplay.errors import InvalidArgumentError, check_count, describe
from rlreplay.writers.adder_options import table_span
from rlreplay.writers.nstep_blocks import COMPILED, NStepBlock
from rlreplay.writers.stream import StreamAdder

COMPUTED = ("n_step_return", "discount")
# Largest row (bytes) recorded in blocks: past it the extra copies cost more than they save.
BLOCK_ROW_BYTES = 1024


class NStepTransitionAdder(StreamAdder):
    """Adds ``(obs, action, reward, discount, next_obs)`` items, ``reward`` an n-step return.

    For the step at ``t`` with ``m = min(n, steps left)``: ``reward = sum_{j<m} discount**j
    * r_{t+j}``; ``discount = discount**m``, or ``0`` if the episode terminated within those
    steps (truncation bootstraps); ``next_obs = obs_{t+m}``. As in Acme and TorchRL, an
    episode's last ``n - 1`` steps get shorter returns rather than being dropped. With
    ``stack=k``, ``obs`` and ``next_obs`` are ``[k, *frame]`` and each episode starts with
    ``k - 1`` padding rows repeating its first frame. See docs/adders.md.

    Args:
        writer: writer, table or tables (see :class:`StreamAdder`).
        n: steps per return, ``>= 1``.
        discount: per-step discount in ``[0, 1]``.
        stack: frames per observation (1: no stacking).
        stacked_obs: observations arrive stacked ``[..., k, *frame]``; only the newest frame
            is stored.
        **kwargs: the other options of :class:`StreamAdder`.

    Raises:
        InvalidArgumentError: for bad ``n``, ``discount`` or ``stack``.

    Example:
        >>> sig = NStepTransitionAdder.signature(obs=((4,), "float32"), action="int64")
        >>> table = Table("replay", signature=sig, max_size=10_000,        # doctest: +SKIP
        ...               layout=NStepTransitionAdder.layout(sig, n=3))
        >>> adder = NStepTransitionAdder(table, n=3, discount=0.99, num_envs=8)  # doctest: +SKIP
        >>> adder.reset(obs)                                               # doctest: +SKIP
        >>> adder.add(action, reward, next_obs, term, trunc, info)         # doctest: +SKIP
    """

    computed = COMPUTED

    def __init__(
        self,
        writer: Any,
        n: int,
        discount: float,
        *,
        stack: int = 1,
        stacked_obs: bool = False,
        **kwargs: Any,
    ):
        n = check_count(n, "n")
        if not isinstance(discount, (int, float)) or not 0.0 <= discount <= 1.0:
            raise InvalidArgumentError(f"discount={describe(discount)} must be in [0, 1]")
        stack = check_count(stack, "stack")
        self.n = n
        self.discount = float(discount)
        self.stack = stack
        self.stacked_obs = stacked_obs
        self.span = n + stack
        self.lag = n + 1  # complete once the episode went on past its n rewards
        self.pad = stack - 1
        super().__init__(writer, **kwargs)
        for table in self.tables:  # (sequence tables may make self.span longer)
            span = table_span(self.writer, table)
            if span != n + stack:
                name = getattr(table, "name", table)
                raise InvalidArgumentError(
                    f"table {name!r} has items of span {span}, but this adder's n={n} and "
                    f"stack={stack} make items of span {n + stack}; build the table with "
                    f"layout=NStepTransitionAdder.layout(signature, n={n}, stack={stack})"
                )
        self._next_item = np.zeros(self.num_envs, dtype=np.int64)
        self._powers = self.discount ** np.arange(n + 1)
        self._weights = self._powers[:n]  # of a return's n rewards
        self._windows = np.arange(self.capacity)[:, None] + np.arange(n)
        # discount**min(n, k) for a row with k steps left; 0 for the final row.
        self._tail = self._powers[np.minimum(np.arange(self.capacity + 1), n)]
        self._tail[0] = 0.0
        # Extents of an ended episode's last c items: _extents[-1 - c : -1].
        self._extents = (self.stack + np.minimum(np.arange(self.capacity + 1), n))[::-1].copy()
        self._extents.flags.writeable = False
        self._block = self._out.deferred = self._new_block(self._out.every)

    @staticmethod
    def signature(
        obs: Any,
        action: Any,
        extras: Mapping[str, Any] | None = None,
        reward: Any = "float32",
    ) -> Signature:
        """Stored step signature: ``obs`` (one frame), ``action``, ``reward``, extras and the
        computed ``n_step_return`` and ``discount``; specs may be gymnasium spaces, of ONE
        environment (a vector env's ``single_observation_space``/``single_action_space``)."""
        extras = checked_extras(
            extras, ("obs", "action", "reward", *COMPUTED), "NStepTransitionAdder"
        )
        fields = {"obs": obs, "action": action, "reward": reward, **extras}
        fields.update({c: "float32" for c in COMPUTED})
        return Signature(fields)

    @staticmethod
    def layout(signature: Signature | Mapping, n: int, stack: int = 1) -> ItemLayout:
        """Item layout: ``obs``, ``action``, ``reward`` (the n-step return), ``discount``,
        ``next_obs`` and extras; ``obs`` is ``[k, *frame]`` with ``stack=k > 1``."""
        sig = Signature(signature)
        last = stack - 1
        length = None if stack == 1 else stack
        windows = {}
        for p in sig.paths:
            if p == "obs" or p.startswith("obs/"):
                windows[p] = Window(p, 0, length)
                windows["next_" + p] = Window(p, 0, length, from_end=True)
            elif p == "n_step_return":
                windows["reward"] = Window(p, last)
            elif p != "reward":
                windows[p] = Window(p, last)
        return ItemLayout(windows, sig, span=n + stack)

    def _new_block(self, every: int) -> NStepBlock | None:
        # Sequence rules, chunk-filling padding, large rows, no compiled plan: per-call path.
        sig = self._inputs.signature
        row_bytes = sum(
            sig[p].dtype.itemsize * int(np.prod(sig[p].shape)) for p in self._inputs.paths
        )
        if (
            COMPILED
            and self.batched
            and not self._sequences
            and self.pad < self.chunk_length
            and row_bytes <= BLOCK_ROW_BYTES
        ):
            episodes = self._episodes
            return NStepBlock(self, every, episodes, self._next_item, self._powers, self._tail)
        return None

    def _computed(
        self, i: int, lo: int, hi: int, ended: bool, terminated: bool, out: dict[str, np.ndarray]
    ) -> None:
        n, pad, total = self.n, self.pad, int(self._steps[i])
        t0, m = lo - pad, hi - lo  # step of row lo (< 0: padding rows), rows
        lead = min(max(-t0, 0), m)  # padding rows: no item is anchored there
        # Rewards of steps t0 .. t0 + m + n - 2, zero outside the episode.
        r = np.zeros(m + n - 1)
        first, stop = max(t0, 0), min(t0 + m + n - 1, total)
        if stop > first:
            r[first - t0 : stop - t0] = self._rows.field("reward", i, first + pad, stop + pad)
        # float64 values are rounded to the float32 columns as they are written.
        ret = out["n_step_return"]
        ret[:] = r[self._windows[:m]] @ self._weights
        if lead:
            ret[:lead] = 0.0
        disc = out["discount"]
        if ended:  # discount**min(n, steps left); row k leaves m - 1 - k (the last: 0)
            disc[:] = self._tail[m - 1 :: -1]
            if terminated:  # no bootstrapping from a terminal state
                disc[max(total - n - t0, 0) :] = 0.0
        else:
            disc[:] = self._powers[n]
        if lead:
            disc[:lead] = 0.0

    def _items(
        self, i: int, appended: int, ended: bool, terminated: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        first = int(self._next_item[i])
        total = int(self._steps[i])
        stop = total if ended else max(first, appended - self.n - self.stack + 1)
        t = np.arange(first, stop, dtype=np.int64)
        count = stop - first
        if ended and 0 < count < len(self._extents):
            extent = self._extents[-1 - count : -1]
        elif ended:
            extent = self.stack + np.minimum(self.n, total - t)
        else:
            extent = np.full(len(t), self.stack + self.n, dtype=np.int64)
        self._next_item[i] = 0 if ended else stop
        return t, extent
