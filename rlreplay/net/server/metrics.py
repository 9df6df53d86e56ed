"""Optional Prometheus metrics for a :class:`~rlreplay.Server` (``prometheus-client``):
``rlreplay_table_<field>`` with a ``table`` label, read from each table at every scrape."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("rlreplay.net")

GAUGES = {
    "size": "items held",
    "max_size": "most items held",
    "inserts": "items inserted since creation or reset",
    "samples": "items sampled since creation or reset",
    "inserts_per_s": "items inserted per second over the last ~10 s",
    "samples_per_s": "items sampled per second over the last ~10 s",
    "samples_per_insert": "observed samples per insert",
    "insert_blocked_s": "seconds inserts spent blocked by the rate limiter",
    "sample_blocked_s": "seconds samples spent blocked by the rate limiter",
    "evictions": "items evicted by the remover",
    "stale_updates": "priority updates for items no longer held",
}


def serve(server: Any, port: int, addr: str = "127.0.0.1"):
    """Start a metrics endpoint; an object with ``shutdown()``, or None."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import GaugeMetricFamily
    except ImportError:
        log.warning(
            "--metrics-port given but prometheus-client is not installed "
            "(pip install 'rlreplay[metrics]'); serving without metrics"
        )
        return None

    class Collector:
        def collect(self):
            stats = {name: server.table_stats(name) for name in server.tables}
            for field, doc in GAUGES.items():
                family = GaugeMetricFamily(f"rlreplay_table_{field}", doc, labels=["table"])
                for name, info in stats.items():
                    family.add_metric([name], float(info[field]))
                yield family

    registry = CollectorRegistry()
    registry.register(Collector())
    result = start_http_server(port, addr=addr, registry=registry)
    # prometheus-client >= 0.20 returns (server, thread); older ones cannot be stopped.
    return result[0] if isinstance(result, tuple) else None
