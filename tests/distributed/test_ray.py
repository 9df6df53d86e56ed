"""Replay shards as Ray actors and the runtime's ray backend, on a real local Ray.

Needs Ray, which the ``test`` extra installs (so CI runs these): without it they fail at
import, not skip. The tests share one local Ray instance (the module's fixture).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray

pytest.importorskip("gymnasium")

RUNTIME_TESTS = str(Path(__file__).resolve().parents[1] / "runtime")
sys.path.insert(0, RUNTIME_TESTS)  # the runtime tests' picklable parts

import parts  # noqa: E402

import rlreplay.runtime as rt  # noqa: E402
from rlreplay import Prioritized  # noqa: E402
from rlreplay.distributed import ShardedClient  # noqa: E402
from rlreplay.distributed.ray import start_shards  # noqa: E402
from rlreplay.errors import (  # noqa: E402
    ComponentFailedError,
    InvalidArgumentError,
    ReplayTimeoutError,
    ServerUnavailableError,
)

ROWS = {"x": "int64"}
CONFIG = {"table": [{"name": "t", "signature": ROWS, "max_size": 100, "capacity": 100,
                     "sampler": {"type": "Prioritized", "priority_exponent": 1.0}}]}


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    path = os.pathsep.join([RUNTIME_TESTS, os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
def insert_in_task(client: ShardedClient, first: int, n: int) -> list[int]:
    return client.insert("t", {"x": np.arange(first, first + n)}, 1.0).tolist()


@ray.remote(num_cpus=0)
class Learner:
    def __init__(self, client: ShardedClient):
        self.client = client

    def sample(self, n: int) -> tuple[list[int], list[float], int]:
        batch = self.client.sample("t", n, timeout=5.0)
        return batch.data["x"].tolist(), batch.info.probabilities.tolist(), len(batch)


def test_shards_serve_a_client_passed_into_ray_tasks_and_actors_then_shut_down():
    shards = start_shards(CONFIG, 2, num_cpus=0.25, strategy="SPREAD")
    try:
        assert len(shards.addresses) == 2 and len(set(shards.addresses)) == 2
        client = shards.client(first_shard=0)
        keys = ray.get([insert_in_task.remote(ShardedClient(shards.addresses, first_shard=s),
                                              10 * s, 10) for s in range(2)])
        assert [set(client.shard_of(np.array(k)).tolist()) for k in keys] == [{0}, {1}]
        learner = Learner.remote(client)
        x, probs, n = ray.get(learner.sample.remote(50), timeout=30)
        assert n == 50 and set(x) <= set(range(20))
        np.testing.assert_allclose(probs, 1 / 20, rtol=1e-9)  # 20 items, priority 1 each
        ray.kill(learner)
    finally:
        shards.shutdown()
    probe = ShardedClient(shards.addresses, call_timeout=0.5, diagnose_timeout=0.05)
    with pytest.raises(ServerUnavailableError):
        probe.info("t")
    probe.close()


def test_start_shards_refuses_what_it_cannot_start():
    with pytest.raises(InvalidArgumentError, match="num_shards"):
        start_shards(CONFIG, 0)
    with pytest.raises(InvalidArgumentError, match="strategy"):
        start_shards(CONFIG, 1, strategy="ANYWHERE")
    with pytest.raises(InvalidArgumentError, match="signature"):  # the shard's own error
        start_shards({"table": [{"name": "t"}]}, 1, num_cpus=0)
    start = time.monotonic()
    with pytest.raises(ReplayTimeoutError, match=r"could not place.*no node has 1 'replay_node' "
                       r"\(declare it with `ray start --resources="):
        start_shards(CONFIG, 1, resources={"replay_node": 1}, start_timeout=1.0)
    assert time.monotonic() - start < 15


def test_runtime_ray_backend_trains_over_two_shards(monkeypatch):
    learner = parts.CountingLearner()
    config = rt.RuntimeConfig(
        backend="ray", replay_shards=2, num_actors=2, updates_per_env_step=0.25,
        batch_size=16, min_size_to_sample=200, weight_sync_period=50, progress=False,
        timeout_s=30.0,
    )
    run_module = importlib.import_module("rlreplay.runtime.driver")
    tables: list = []

    class KeepsTable(run_module.Learner):  # the learner's table: the sharded table
        def __init__(self, logic, table, *args):
            tables.append(table)
            super().__init__(logic, table, *args)

    monkeypatch.setattr(run_module, "Learner", KeepsTable)
    seen: dict = {}

    def on_stats(row, weights):  # while the shards serve: what each one holds
        seen.update(tables[0].client.shard_info("replay"))
        return {}

    result = rt.run(
        config, make_env=parts.make_env, make_policy=parts.RandomPolicy, learner=learner,
        replay=parts.replay(sampler=Prioritized(0.6)), total_env_steps=4_000,
        on_stats=on_stats,
    )
    assert result.summary["env_steps"] == 4_000
    assert learner.updates > 0 and result.summary["weight_version"] >= 1
    # actor i wrote to shard i % 2, and the learner sampled both
    assert sorted(seen) == [0, 1]
    assert all(info.inserts > 0 and info.samples > 0 for info in seen.values())
    probe = ShardedClient(result.table.client.addresses, call_timeout=0.5,
                          diagnose_timeout=0.05)
    with pytest.raises(ServerUnavailableError):  # the shards stopped with the run
        probe.info("replay")
    probe.close()


def test_runtime_ray_backend_names_an_actor_that_raises():
    config = rt.RuntimeConfig(
        backend="ray", replay_shards=2, num_actors=2, updates_per_env_step=0.25,
        batch_size=16, min_size_to_sample=200, weight_sync_period=50, progress=False,
        timeout_s=30.0,
    )
    with pytest.raises(ComponentFailedError, match="policy exploded") as info:
        rt.run(config, make_env=parts.make_env, make_policy=parts.CrashingPolicy,
               learner=parts.CountingLearner(), replay=parts.replay(), total_env_steps=20_000)
    assert info.value.component.startswith("actor ")


def test_apex_example_runs_with_the_ray_backend_on_two_shards(tmp_path):
    pytest.importorskip("torch")
    from rlreplay.examples import apex_dqn as apex

    out = tmp_path / "run"
    summary = apex.main(["--backend", "ray", "--replay-shards", "2", "--total-steps", "400",
                         "--learning-starts", "100", "--hidden", "16", "--no-progress",
                         "--eval-episodes", "1", "--out", str(out)])
    assert summary["env_steps"] == 400 and summary["backend"] == "ray"
    assert summary["updates"] > 0
    assert (out / "metrics.csv").exists()


def test_shards_checkpoint_to_the_given_folder_and_restore_from_it(tmp_path):
    shards = start_shards(CONFIG, 2, num_cpus=0, checkpoint_dir=tmp_path)
    try:
        client = shards.client(first_shard=0)
        for first in (0, 10):
            client.insert("t", {"x": np.arange(first, first + 10)}, 1.0)
        paths = shards.checkpoint(timeout=60.0)
    finally:
        shards.shutdown()
    assert [Path(p).parent.name for p in paths] == ["shard-0", "shard-1"]
    again = start_shards(CONFIG, 2, num_cpus=0, checkpoint_dir=tmp_path)
    try:
        client = again.client()
        assert [i.size for i in client.shard_info("t").values()] == [10, 10]
        assert set(client.sample("t", 100, timeout=5.0).data["x"].tolist()) <= set(range(20))
    finally:
        again.shutdown()
