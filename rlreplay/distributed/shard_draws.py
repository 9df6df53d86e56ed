"""How a sharded sample is drawn: how many items each shard gives, and what each drawn
item's probability is over all shards.

One table holding every item draws each of a batch's ``B`` items independently with
``P(i) = w_i / M``, where ``w_i`` is the item's selection weight (``priority **
priority_exponent`` for a prioritized sampler, 1 for a uniform one) and ``M = sum_s M_s``
the total over all shards' masses ``M_s``. The same distribution, drawn over shards:

1. split ``B`` over the shards as one multinomial draw with cell probabilities
   ``q_s = M_s / M`` (each of the ``B`` draws picks shard ``s`` with probability
   ``q_s``), then
2. let each shard draw its ``k_s`` items with its own sampler, ``P_s(i) = w_i / M_s``.

Each item is then drawn with probability ``q_s * P_s(i) = w_i / M``, independently, and
the concatenated batch (put in a random order) is distributed exactly as one big table's
batch. The masses come with every reply, so ``q_s`` is computed from the masses the shards
reported last: when the tables change between that reply and the draw, ``q_s`` lags by a
round trip. The probability reported for an item is always ``q_s * P_s(i)`` with the
``q_s`` that was used and the ``P_s(i)`` the shard drew with, so it is exactly the
probability with which the item was selected, and importance weights built from it
(with ``N = sum_s N_s``) correct for the distribution actually drawn.

Rate limiters. Each shard's limiter admits or holds back its own part. A shard whose
limiter cannot admit a whole batch now (its *credit*, the most items one sample may take,
reported with every reply, is below the batch size) gets no part while another shard's
credit covers the batch: the split runs over the shards that can be sampled, which is
the distribution conditioned on them (when none covers a batch, over those with some
credit; while every shard is held back, over all, and the batch waits). A part that its
shard holds back past the call's timeout is kept waiting while the shard's credit could
cover it, and otherwise drawn again over the other shards (conditioned as for a shard
that went down). So a learner is never stopped, nor slowed to one batch per timeout, by
one shard whose writers finished while others still take inserts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlreplay.core.sample import Sample, SampleInfo
from rlreplay.errors import InvalidArgumentError

# Samplers whose draws split over shards as above (the others pick items in an order,
# which no split of a batch reproduces).
SHARDABLE = ("Uniform", "Prioritized")


@dataclass
class ShardState:
    """What the client last heard of one shard's table (from any reply)."""

    table_size: int = 0
    mass: float = 0.0
    min_probability: float = 0.0
    credit: int = 0  # the most items its rate limiter would let one sample take

    def observe(self, header: dict) -> None:
        """Take the size, mass, smallest probability and credit a reply carries."""
        self.table_size = int(header["table_size"])
        self.min_probability = float(header["min_probability"])
        self.mass = float(header["mass"])
        self.credit = int(header.get("credit", 2**31))


def split(batch_size: int, masses: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Items each shard draws: a multinomial draw of ``batch_size`` over ``masses``.

    Args:
        masses: one non-negative mass per shard, with a positive sum.

    Returns:
        int64 counts, one per shard, summing to ``batch_size``.
    """
    q = masses / masses.sum()
    return rng.multinomial(batch_size, q).astype(np.int64)


def check_samplers(configs: list[dict], table: str, addresses: list[str]) -> None:
    """Refuse shards whose samplers cannot be split exactly, or differ.

    Raises:
        InvalidArgumentError: for a sampler other than Uniform or Prioritized, or shards
            whose sampler configs differ (their masses would not be comparable).
    """
    first = configs[0]
    if first.get("type") not in SHARDABLE:
        raise InvalidArgumentError(
            f"table {table!r} samples with {first}; a sharded client samples tables with "
            f"a {' or '.join(SHARDABLE)} sampler (the others pick items in an order that "
            "no split over shards reproduces); sample each shard's client instead"
        )
    for config, address in zip(configs, addresses):
        if config != first:
            raise InvalidArgumentError(
                f"table {table!r} samples with {config} at {address} but with {first} at "
                f"{addresses[0]}; every shard's table needs the same sampler"
            )


def merge(
    parts: list[tuple[int, dict]],
    shares: np.ndarray,
    states: list[ShardState],
    to_global,
    rng: np.random.Generator,
) -> Sample:
    """One :class:`Sample` from the shards' replies, in a random order.

    Args:
        parts: ``(shard, reply arrays)`` of each shard that drew items.
        shares: the ``q_s`` the batch was drawn with (one per shard, summing to 1).
        states: every shard's latest state (for the table size and smallest probability;
            already updated from this round's replies).
        to_global: ``to_global(local_keys, shard)`` gives the client's keys.
        rng: shuffles the batch's order.

    Returns:
        The sample, with probabilities ``q_s * P_s(i)``, ``table_size = sum_s N_s`` and
        ``min_probability`` the smallest ``q_s * P_min,s`` over shards that could be drawn.
    """
    if len(parts) == 1:  # one shard's draws are already in a random order: no copies
        return _one_part(*parts[0], shares, states, to_global)
    lengths = [len(arrays["keys"]) for _, arrays in parts]
    total = sum(lengths)
    order = rng.permutation(total)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    where = [order[offsets[j] : offsets[j + 1]] for j in range(len(parts))]
    data = {}
    for name, first in parts[0][1].items():
        if not name.startswith("data/"):
            continue
        out = np.empty((total, *first.shape[1:]), dtype=first.dtype)
        for (_, arrays), at in zip(parts, where):
            out[at] = arrays[name]
        data[name[5:]] = out
    keys = np.empty(total, np.int64)
    probabilities = np.empty(total)
    priorities = np.empty(total)
    times = np.empty(total, np.int64)
    for (shard, arrays), at in zip(parts, where):
        keys[at] = to_global(arrays["keys"], shard)
        probabilities[at] = shares[shard] * arrays["probabilities"]
        priorities[at] = arrays["priorities"]
        times[at] = arrays["times_sampled"]
    info = SampleInfo(keys, probabilities, priorities, times, *_sizes(shares, states))
    return Sample(data, info)


def _one_part(shard: int, arrays: dict, shares: np.ndarray, states: list[ShardState],
              to_global) -> Sample:
    data = {name[5:]: a for name, a in arrays.items() if name.startswith("data/")}
    probabilities = arrays["probabilities"] * shares[shard]
    info = SampleInfo(
        to_global(arrays["keys"], shard), probabilities, arrays["priorities"],
        arrays["times_sampled"], *_sizes(shares, states),
    )
    return Sample(data, info)


def _sizes(shares: np.ndarray, states: list[ShardState]) -> tuple[int, float]:
    """The batch's ``table_size`` (all shards' items) and ``min_probability`` (the
    smallest ``q_s * P_min,s`` over shards that could be drawn)."""
    drawable = [
        shares[s] * st.min_probability
        for s, st in enumerate(states)
        if shares[s] > 0 and st.table_size > 0 and st.min_probability > 0
    ]
    return sum(st.table_size for st in states), min(drawable) if drawable else 0.0
