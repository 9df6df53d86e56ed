"""ShardedClient.checkpoint: one checkpoint per shard, asked for at once; a shard without
a checkpoint directory or a shard down is a typed error naming it (or, for a shard down
under "skip", left out)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from shardprocs import shards, table

from rlreplay.checkpoint import list_checkpoints
from rlreplay.distributed import ShardedClient
from rlreplay.errors import InvalidArgumentError, ShardUnavailableError

CONFIG = {"table": [table("t")]}
FAST = {"call_timeout": 2.0, "liveness_s": 0.5, "diagnose_timeout": 0.1}


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    x = np.arange(first, first + n)
    return {"x": x, "obs": np.stack([x, x], 1).astype(np.float32)}


def test_checkpoint_saves_every_shard_and_returns_the_paths_by_shard(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    options = [{"checkpoint_dir": str(d)} for d in dirs]
    with shards([CONFIG] * 2, options) as started:
        client = ShardedClient([a for a, _ in started], first_shard=0, **FAST)
        try:
            client.insert("t", rows(0, 5))
            client.insert("t", rows(5, 3))  # the other shard (fewest rows sent)
            paths = client.checkpoint(timeout=30.0)
        finally:
            client.close()
    assert sorted(paths) == [0, 1]
    for shard, directory in enumerate(dirs):
        assert Path(paths[shard]).parent == directory
        assert list_checkpoints(directory) == [Path(paths[shard])]


def test_a_shard_without_a_checkpoint_dir_is_named_and_the_others_still_save(tmp_path):
    with shards([CONFIG] * 2, [{"checkpoint_dir": str(tmp_path / "a")}, {}]) as started:
        client = ShardedClient([a for a, _ in started], **FAST)
        try:
            with pytest.raises(InvalidArgumentError, match="checkpoint_dir") as caught:
                client.checkpoint(timeout=30.0)
        finally:
            client.close()
    message = str(caught.value)
    assert message.startswith(f"replay shard 1 at {client.addresses[1]}: ")
    saved = list_checkpoints(tmp_path / "a")
    assert len(saved) == 1 and str(saved[0]) in message  # shard 0 published its own


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_shard_down_follows_the_on_shard_down_policy(tmp_path, policy):
    options = [{"checkpoint_dir": str(tmp_path / "a")}, {"checkpoint_dir": str(tmp_path / "b")}]
    with shards([CONFIG] * 2, options) as started:
        started[1][1].kill()
        started[1][1].join(10.0)
        client = ShardedClient([a for a, _ in started], on_shard_down=policy, **FAST)
        try:
            start = time.monotonic()
            if policy == "fail":
                with pytest.raises(ShardUnavailableError) as caught:
                    client.checkpoint(timeout=30.0)
                assert caught.value.shard == 1
                assert caught.value.address == client.addresses[1]
            else:
                paths = client.checkpoint(timeout=30.0)
                assert list(paths) == [0]
            assert time.monotonic() - start < 15.0
        finally:
            client.close()
    # the shard that answered saved its checkpoint either way
    assert len(list_checkpoints(tmp_path / "a")) == 1


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_shard_killed_after_answering_uses_none_of_the_others_time(tmp_path, policy):
    """Shard 0 answered once, then was killed: waiting for it until the deadline must not
    leave shard 1's reply, which came meanwhile, unread (it published its checkpoint)."""
    options = [{"checkpoint_dir": str(tmp_path / "a")}, {"checkpoint_dir": str(tmp_path / "b")}]
    with shards([CONFIG] * 2, options) as started:
        client = ShardedClient([a for a, _ in started], on_shard_down=policy, **FAST)
        try:
            assert list(client.checkpoint(timeout=5.0)) == [0, 1]
            started[0][1].kill()
            started[0][1].join(10.0)
            if policy == "fail":
                with pytest.raises(ShardUnavailableError) as caught:
                    client.checkpoint(timeout=1.0)
                assert caught.value.shard == 0
                assert "the other shards published {1:" in str(caught.value)
            else:
                assert list(client.checkpoint(timeout=1.0)) == [1]
        finally:
            client.close()
    assert len(list_checkpoints(tmp_path / "b")) == 2
