"""A shard whose server process was killed: a typed error naming it ("fail"), or
batches over the reachable shards with their probabilities ("skip")."""

from __future__ import annotations

import time

import numpy as np
import pytest
from shardprocs import shards, table

from rlreplay import Prioritized, Table
from rlreplay.distributed import ShardedClient
from rlreplay.errors import InvalidArgumentError, ServerUnavailableError, ShardUnavailableError

ALPHA = 0.6
CONFIG = {"table": [table("prio", sampler={"type": "Prioritized", "priority_exponent": ALPHA})]}
FAST = {"call_timeout": 2.0, "liveness_s": 0.5, "diagnose_timeout": 0.1}


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    x = np.arange(first, first + n)
    return {"x": x, "obs": np.stack([x, x], 1).astype(np.float32)}


@pytest.fixture
def three_shards_one_killed():
    """Three shards holding x = 0..29 (10 each, priority 1 + x); shard 1 then killed."""
    with shards([CONFIG] * 3) as started:
        addresses = [a for a, _ in started]
        loader = ShardedClient(addresses, first_shard=0, **FAST)
        keys = np.concatenate(
            [loader.insert("prio", rows(10 * i, 10), 1.0 + np.arange(10 * i, 10 * i + 10))
             for i in range(3)]
        )
        assert loader.shard_of(keys).tolist() == [0] * 10 + [1] * 10 + [2] * 10
        loader.close()
        started[1][1].kill()
        started[1][1].join(10.0)
        yield addresses, keys


def test_fail_policy_raises_a_typed_error_naming_the_shard(three_shards_one_killed):
    addresses, keys = three_shards_one_killed
    client = ShardedClient(addresses, on_shard_down="fail", **FAST)
    start = time.monotonic()
    with pytest.raises(ShardUnavailableError) as caught:
        client.sample("prio", 16, timeout=1.0)
    assert caught.value.shard == 1 and caught.value.address == client.addresses[1]
    assert isinstance(caught.value, ServerUnavailableError)
    assert time.monotonic() - start < 10.0
    with pytest.raises(ShardUnavailableError) as caught:
        client.update_priorities("prio", keys[8:12], 5.0)
    assert caught.value.shard == 1
    client.close()


def test_skip_policy_samples_the_reachable_shards_with_their_probabilities(
    three_shards_one_killed,
):
    addresses, keys = three_shards_one_killed
    client = ShardedClient(addresses, on_shard_down="skip", retry_down_s=60.0, seed=3, **FAST)
    batches = [client.sample("prio", 64, timeout=1.0) for _ in range(3)]
    assert client.health.is_down(1)
    # one big table holding what is reachable: x = 0..9 and 20..29
    reach = np.r_[0:10, 20:30]
    big = Table("prio", signature={"x": "int64"}, max_size=100, sampler=Prioritized(ALPHA))
    big.insert({"x": reach}, 1.0 + reach)
    probs = dict(zip(reach.tolist(), big.index.sampler.probabilities(np.arange(20))))
    for batch in batches:
        x = batch.data["x"]
        assert len(x) == 64 and not np.isin(x, np.r_[10:20]).any()
        np.testing.assert_allclose(batch.info.probabilities, [probs[v] for v in x], rtol=1e-6)
        assert batch.info.table_size == 20
    # inserts go to the shards that answer; updates of the lost shard's keys are skipped
    new = client.insert("prio", rows(100, 5), 1.0)
    assert set(client.shard_of(new).tolist()) <= {0, 2}
    assert client.update_priorities("prio", keys[8:12], 2.0) == 2
    assert client.info("prio").size == 25
    client.close()


@pytest.mark.parametrize("call", ["info", "sample", "update_priorities", "insert", "can_insert"])
def test_skip_policy_answers_over_the_live_shard_when_one_dies_after_answering(call):
    """Shard 0 answered, then was killed: under "skip" each call waits for it until its
    deadline, marks it down and answers over shard 1 (whose reply came meanwhile)."""
    with shards([CONFIG] * 2) as started:
        client = ShardedClient(
            [a for a, _ in started], on_shard_down="skip", first_shard=0, **FAST
        )
        keys = np.concatenate([client.insert("prio", rows(10 * s, 10), 1.0) for s in range(2)])
        client.can_insert("prio")
        client.sample("prio", 8, timeout=1.0)
        started[0][1].kill()
        started[0][1].join(10.0)
        start = time.monotonic()
        if call == "info":
            assert client.info("prio").size == 10
        elif call == "sample":
            batch = client.sample("prio", 8, timeout=1.0)
            assert (client.shard_of(batch.info.keys) == 1).all()
        elif call == "update_priorities":
            ours = keys[client.shard_of(keys) == 1]
            assert client.update_priorities("prio", ours, 9.0) == len(ours)
        elif call == "insert":  # the next insert's shard is shard 0 (fewest rows sent)
            assert (client.shard_of(client.insert("prio", rows(20, 2), 1.0)) == 1).all()
        else:
            assert client.can_insert("prio") is True
        assert time.monotonic() - start < 6.0  # the call's deadline, plus the reply grace
        client.close()


def test_a_shard_refusing_its_keys_is_named_with_the_shards_that_applied_theirs():
    with shards([CONFIG] * 2) as started:
        client = ShardedClient([a for a, _ in started], first_shard=0, **FAST)
        keys = client.insert("prio", rows(0, 4), 1.0)
        made_up = client.keys.to_global(np.array([500]), 1)  # a key shard 1 never issued
        with pytest.raises(InvalidArgumentError, match=r"replay shard 1 .*shards \[0\] applied"):
            client.update_priorities("prio", np.concatenate([keys, made_up]), 7.0)
        assert (client.sample("prio", 4, timeout=1.0).info.priorities == 7.0).all()
        client.close()


def test_a_new_client_skips_several_stalled_shards_within_its_call():
    """Three of four shards stalled (SIGSTOP) before a new client greets them: looking at
    why they are silent takes at most half the call's time, and the call is answered by
    the live shard."""
    import os
    import signal

    with shards([CONFIG] * 4) as started:
        addresses = [a for a, _ in started]
        ShardedClient(addresses[:1], **FAST).insert("prio", rows(0, 10), 1.0)
        for _, proc in started[1:]:
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            client = ShardedClient(addresses, on_shard_down="skip", **FAST)
            batch = client.sample("prio", 4, timeout=1.0)
            assert (client.shard_of(batch.info.keys) == 0).all()
            client.close()
        finally:
            for _, proc in started[1:]:
                os.kill(proc.pid, signal.SIGCONT)


def test_a_call_refused_by_a_shard_leaves_no_reply_of_the_others_unread():
    with shards([CONFIG] * 2) as started:
        client = ShardedClient([a for a, _ in started], **FAST)
        for _ in range(5):
            with pytest.raises(InvalidArgumentError, match="not served"):
                client.reset("nope")
        client.info("prio")
        for shard in client.shards:
            channel = shard.transport.channel()
            assert not channel.replies and not channel.pending
        client.close()


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_a_learners_round_in_flight_finds_its_shard_died_while_the_learner_was_away(policy):
    """A round sent by an earlier ``next`` is finished by a later one, long after the
    earlier call's deadline: its replies are awaited within the later call, so a shard
    that died meanwhile is found down (the batch goes on over the other, or the error
    names the shard), never taken for one that answers but timed out."""
    with shards([CONFIG] * 2) as started:
        client = ShardedClient([a for a, _ in started], on_shard_down=policy, **FAST)
        for s in range(2):  # 20 rows on each shard
            client.insert("prio", rows(20 * s, 20), 1.0)
        with client.sample_iterator("prio", 8, in_flight=2, timeout=1.0) as it:
            next(it)
            started[1][1].kill()
            started[1][1].join(10.0)
            time.sleep(2.0)  # past the deadline of the round in flight
            if policy == "skip":
                next(it)  # (shard 1's part, if its reply came before the kill)
                time.sleep(2.0)  # the round this call sent to the dead shard, left waiting
                assert (client.shard_of(next(it).info.keys) == 0).all()
            else:
                with pytest.raises(ShardUnavailableError) as info:
                    next(it)
                    next(it)
                assert info.value.shard == 1
        client.close()


def test_leaving_an_iterators_with_block_by_an_exception_drops_a_down_shards_updates():
    """The user's exception leaves the block at once: the queued priority updates of a
    shard down are dropped, with a warning, never waited for or raised."""
    import os
    import signal

    with shards([CONFIG] * 2) as started:
        client = ShardedClient([a for a, _ in started], **FAST)
        for s in range(2):
            client.insert("prio", rows(20 * s, 20), 1.0)
        try:
            start = time.monotonic()
            with (
                pytest.raises(KeyError, match="the user's"),
                client.sample_iterator("prio", 8, in_flight=1, timeout=1.0) as it,
            ):
                batch = next(it)
                os.kill(started[1][1].pid, signal.SIGSTOP)
                it.update_priorities(batch.info.keys, np.full(len(batch), 2.0))
                with pytest.raises(ShardUnavailableError):
                    next(it)
                it.update_priorities(batch.info.keys, np.full(len(batch), 3.0))
                left = time.monotonic()
                raise KeyError("the user's")
            assert time.monotonic() - left < 1.0  # no handshake or reply waited for
            assert time.monotonic() - start < 10.0
        finally:
            os.kill(started[1][1].pid, signal.SIGCONT)
        client.close()


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_a_writer_on_a_shard_that_died_names_the_shard(policy):
    """A writer's steps cannot go to another shard: its call raises the error naming its
    shard under either policy, and under "skip" the shard is then taken for down."""
    seq = table("seq", layout={"type": "transition", "n_step": 1, "next_fields": ["obs"]})
    with shards([{"table": [seq]}] * 2) as started:
        client = ShardedClient([a for a, _ in started], on_shard_down=policy, **FAST)
        writer = client.trajectory_writer("seq", shard=1)
        writer.append({"x": np.int64(0), "obs": np.zeros(2, np.float32)})
        started[1][1].kill()
        started[1][1].join(10.0)
        writer.append({"x": np.int64(1), "obs": np.zeros(2, np.float32)})
        writer.create_item("seq")
        with pytest.raises(ShardUnavailableError) as info:
            writer.flush(timeout=1.0)
        assert info.value.shard == 1 and info.value.address == started[1][0]
        if policy == "skip":
            assert client.health.is_down(1)
        client.close()
