"""The ray backend's configuration, checked without Ray: how the table is divided over
shards, and replay_shards refused where no backend starts shards."""

from __future__ import annotations

import dataclasses
import functools

import pytest

import rlreplay as rr
import rlreplay.runtime as rt
from rlreplay.distributed.ray_backend import ShardTables, check_shardable, shard_config
from rlreplay.errors import InvalidArgumentError

SIG = rr.NStepTransitionAdder.signature(
    obs=((4,), "float32"), action="int64", extras={rt.POLICY_VERSION: "int64"}
)
REPLAY = rt.ReplaySpec(
    signature=SIG, layout=rr.NStepTransitionAdder.layout(SIG, n=2),
    adder=functools.partial(rr.NStepTransitionAdder, n=2, discount=0.99), max_size=1001,
    sampler=rr.Prioritized(0.6),
)


@pytest.mark.parametrize("backend", ["inline", "threads", "processes"])
def test_replay_shards_need_the_ray_backend(backend):
    with pytest.raises(InvalidArgumentError, match=r"replay_shards=2.*backend='ray'"):
        rt.RuntimeConfig(backend=backend, replay_shards=2, samples_per_insert=4.0)
    with pytest.raises(InvalidArgumentError, match="replay_shards"):
        rt.RuntimeConfig(backend="ray", replay_shards=0, samples_per_insert=4.0)


def test_each_shard_holds_its_share_of_the_table_at_the_same_ratio():
    config = rt.RuntimeConfig(backend="ray", replay_shards=2, num_actors=3,
                              samples_per_insert=4.0, min_size_to_sample=101, seed=5)
    shards = [shard_config(config, REPLAY, i) for i in range(2)]
    for index, (cfg, replay) in enumerate(shards):
        assert replay.max_size == 501 and cfg.min_size_to_sample == 51
        assert cfg.ratio == 4.0 and cfg.num_actors == 2
        assert cfg.error_buffer == config.limiter_buffer()
        tables = ShardTables(config, REPLAY, index, {"w": [1.0]})()
        assert [t.name for t in tables] == (["replay", "weights"] if index == 0 else ["replay"])
        assert tables[0].max_size == 501
    assert shards[0][0].seed != shards[1][0].seed  # shards draw apart


def test_tables_that_cannot_be_sharded_are_refused_before_anything_starts():
    config = rt.RuntimeConfig(backend="ray", replay_shards=2, num_actors=2,
                              samples_per_insert=4.0)
    queue = dataclasses.replace(REPLAY, on_policy=True)
    with pytest.raises(InvalidArgumentError, match="on-policy"):
        check_shardable(config, queue)
    with pytest.raises(InvalidArgumentError, match="Uniform or Prioritized"):
        check_shardable(config, dataclasses.replace(REPLAY, sampler=rr.MaxHeap()))
    check_shardable(config, REPLAY)
    one = rt.RuntimeConfig(backend="ray", replay_shards=1, samples_per_insert=4.0)
    check_shardable(one, queue)  # one shard: served as it is


def test_more_shards_than_actors_are_refused_before_anything_starts():
    # actor i writes to shard i % replay_shards: shards 2 and 3 would stay empty
    config = rt.RuntimeConfig(backend="ray", replay_shards=4, num_actors=2,
                              samples_per_insert=4.0)
    with pytest.raises(InvalidArgumentError, match=r"replay_shards=4 is more than "
                                                   r"num_actors=2: .*shards 2\.\.3 would get "
                                                   r"no steps.*use replay_shards <= num_actors"):
        check_shardable(config, REPLAY)
    check_shardable(dataclasses.replace(config, num_actors=4), REPLAY)
