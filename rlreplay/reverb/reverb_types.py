"""Reverb's ``TableInfo`` and the option records it holds, as plain Python objects
(Reverb's are protocol buffers; these answer the same attribute reads and ``HasField``)."""

from __future__ import annotations

import dataclasses
from typing import Any

META_TABLE = "__reverb_tables__"
"""The table a server of this layer keeps its tables' descriptions in, as one JSON item
(what :func:`table_info` reads, with each table's counters)."""


class _Record:
    """Attribute access over a dict, with protobuf's ``HasField`` (a set, non-empty field)."""

    def __init__(self, **fields: Any):
        self.__dict__.update(fields)

    def HasField(self, name: str) -> bool:
        value = self.__dict__.get(name)
        return value is not None and value is not False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Record) and other.__dict__ == self.__dict__

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if v not in (None, False))
        return f"{type(self).__name__}({inner})"


class KeyDistributionOptions(_Record):
    """A selector's options: one of ``fifo``, ``lifo``, ``uniform`` (True when chosen),
    ``prioritized`` (with ``priority_exponent``), ``heap`` (with ``min_heap``)."""

    def __init__(self, options: dict[str, Any]):
        fields: dict[str, Any] = {
            "fifo": False,
            "lifo": False,
            "uniform": False,
            "prioritized": None,
            "heap": None,
        }
        for name, value in options.items():
            fields[name] = _Record(**value) if isinstance(value, dict) else value
        fields["is_deterministic"] = bool(fields["fifo"] or fields["lifo"] or fields["heap"])
        super().__init__(**fields)


class RateLimiterInfo(_Record):
    """``samples_per_insert``, ``min_size_to_sample``, ``min_diff``, ``max_diff`` and the
    call counts (``insert_stats.completed``, ``sample_stats.completed``)."""


@dataclasses.dataclass
class TableInfo:
    """What Reverb's ``Table.info`` and ``Client.server_info`` report of a table.

    ``num_episodes`` and ``num_deleted_episodes`` are 0 (rlreplay tables do not count
    episodes), ``table_worker_time`` is ``None``; ``num_unique_samples`` is the number of
    items sampled at least once since the table was made or reset, as Reverb counts them.
    """

    name: str
    sampler_options: KeyDistributionOptions
    remover_options: KeyDistributionOptions
    max_size: int
    max_times_sampled: int
    rate_limiter_info: RateLimiterInfo
    signature: Any
    current_size: int
    num_episodes: int = 0
    num_deleted_episodes: int = 0
    num_unique_samples: int = 0
    table_worker_time: Any = None


def table_info(meta: dict[str, Any], stats: dict[str, Any], signature: Any) -> TableInfo:
    """A :class:`TableInfo` from a table's description (``meta``, see
    :meth:`rlreplay.reverb.server.Table.describe`) and its rlreplay info ``stats``."""
    limiter = dict(meta["rate_limiter"])
    limiter["insert_stats"] = _Record(completed=int(stats.get("inserts", 0)))
    limiter["sample_stats"] = _Record(completed=int(stats.get("samples", 0)))
    return TableInfo(
        name=meta["name"],
        sampler_options=KeyDistributionOptions(meta["sampler"]),
        remover_options=KeyDistributionOptions(meta["remover"]),
        max_size=int(meta["max_size"]),
        max_times_sampled=int(meta["max_times_sampled"]),
        rate_limiter_info=RateLimiterInfo(**limiter),
        signature=signature,
        current_size=int(stats.get("size", 0)),
        num_unique_samples=int(stats.get("sampled_items", 0)),
    )
