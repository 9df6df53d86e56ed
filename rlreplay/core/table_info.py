"""TableInfo: a snapshot of a table's counters and configuration."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class TableInfo:
    """Counters and configuration of a table at one moment.

    ``inserts`` and ``samples`` are the rate limiter's counts, since creation or the last
    :meth:`Table.reset`; every other counter (deletes, evictions, stale keys, time blocked)
    counts since the table was created.
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

    def to_dict(self) -> dict:
        return asdict(self)
