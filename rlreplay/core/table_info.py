"""TableInfo: a snapshot of a table's counters and configuration."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class TableInfo:
    """Counters and configuration of a table at one moment.

    ``inserts``, ``samples`` and ``sampled_items`` count since creation or the last
    :meth:`Table.reset`; other counters since creation. ``insert_blocked_s`` and
    ``sample_blocked_s`` sum the seconds all calls waited for the rate limiter.
    """

    name: str
    size: int
    max_size: int
    store_capacity: int
    stored_steps: int
    sampler: str
    remover: str
    rate_limiter: dict
    max_times_sampled: int
    inserts: int
    samples: int
    deletes: int
    evictions: int
    overwrite_evictions: int
    relocations: int
    stale_updates: int
    stale_deletes: int
    insert_blocked_s: float
    sample_blocked_s: float
    index_bytes: int
    sampled_items: int = 0  # (a server from before this counter does not send it)

    @classmethod
    def from_stats(cls, stats: dict) -> TableInfo:
        """The info in a server's statistics of a table."""
        return cls(**{k: v for k, v in stats.items() if k in cls.__dataclass_fields__})

    def to_dict(self) -> dict:
        return asdict(self)
