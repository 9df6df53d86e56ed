"""How a sharded sample is drawn: each shard's share of a batch and each item's probability.

A multinomial split with ``q_s = M_s / M``, then each shard's own draw, gives each item
probability ``w_i / M``, as one table holding every item. The reported ``q_s * P_s(i)``
uses the ``q_s`` drawn with, so importance weights stay exact. See docs/distributed.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlreplay.core.sample import Sample, SampleInfo
from rlreplay.errors import InvalidArgumentError

# Samplers that pick items in an order cannot be split over shards.
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
        InvalidArgumentError: for a sampler not Uniform or Prioritized, or differing configs.
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
        states: every shard's latest state.
        to_global: ``to_global(local_keys, shard)`` gives the client's keys.
        rng: shuffles the batch's order.
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
    """The batch's ``table_size`` and ``min_probability`` over all shards."""
    drawable = [
        shares[s] * st.min_probability
        for s, st in enumerate(states)
        if shares[s] > 0 and st.table_size > 0 and st.min_probability > 0
    ]
    return sum(st.table_size for st in states), min(drawable) if drawable else 0.0
