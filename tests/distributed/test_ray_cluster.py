"""Placement on a simulated multi-node Ray cluster (several raylets on this machine, each
with its own custom resources), as docs/distributed.md shows. Slow (about 20 s: it starts
three Ray nodes), so deselected by default: run it with ``-m slow``. Needs Ray."""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from rlreplay.distributed.ray import start_shards  # noqa: E402

CONFIG = {"table": [{"name": "replay", "signature": {"x": "int64"}, "max_size": 1000,
                     "capacity": 1000}]}


@pytest.mark.slow
def test_shards_are_spread_over_the_nodes_that_declare_the_replay_resource():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, resources={"replay": 1})
        ray.init(address=cluster.address, log_to_driver=False)
        shards = start_shards(CONFIG, 2, num_cpus=0.5, resources={"replay": 1},
                              strategy="STRICT_SPREAD")
        try:
            assert len(set(shards.node_ids)) == 2
            assert ray.get_runtime_context().get_node_id() not in shards.node_ids
            client = shards.client(first_shard=0)
            client.insert("replay", {"x": np.arange(10)})
            client.insert("replay", {"x": np.arange(10, 20)})
            assert set(client.sample("replay", 50, timeout=5.0).data["x"]) <= set(range(20))
            assert [i.size for i in client.shard_info("replay").values()] == [10, 10]
        finally:
            shards.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()
