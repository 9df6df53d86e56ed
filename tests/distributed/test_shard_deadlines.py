"""Every call of a sharded client is bounded by its own timeout (by ``call_timeout`` when it
has none), whatever shards are down: a shard killed, or one never started."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from shardprocs import shards, table

from rlreplay.distributed import ShardedClient
from rlreplay.errors import RateLimiterTimeoutError, ShardUnavailableError
from rlreplay.net.client.transport import REPLY_GRACE_S

CONFIG = {"table": [table("prio", sampler={"type": "Prioritized", "priority_exponent": 0.6})]}
# A long call_timeout: a call with a timeout of its own must not wait for it.
SLOW = {"call_timeout": 30.0, "liveness_s": 0.5, "diagnose_timeout": 0.1}
TIMEOUT = 1.0
LIMIT_S = TIMEOUT + 0.5 + 1.0  # the timeout, the reply grace, a margin for a loaded machine


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    x = np.arange(first, first + n)
    return {"x": x, "obs": np.stack([x, x], 1).astype(np.float32)}


def free_address() -> str:
    """A loopback address nothing listens at (a shard never started)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def timed(call):
    start = time.monotonic()
    try:
        return call(), time.monotonic() - start
    except Exception as error:
        return error, time.monotonic() - start


@pytest.fixture(scope="module")
def live_and_killed():
    """A shard holding x = 0..9 and the address of a shard killed with kill -9."""
    with shards([CONFIG] * 2) as started:
        addresses = [a for a, _ in started]
        for i, address in enumerate(addresses):
            loader = ShardedClient([address], **SLOW)
            loader.insert("prio", rows(10 * i, 10), 1.0)
            loader.close()
        started[1][1].kill()
        started[1][1].join(10.0)
        yield addresses


@pytest.mark.parametrize("down", ["killed", "never started"])
def test_fail_policy_calls_raise_within_their_own_timeout(live_and_killed, down):
    dead = live_and_killed[1] if down == "killed" else free_address()
    # first_shard=1: the insert goes to the shard that is down
    client = ShardedClient([live_and_killed[0], dead], on_shard_down="fail", first_shard=1,
                           **SLOW)
    calls = {
        "sample": lambda: client.sample("prio", 8, timeout=TIMEOUT),
        "insert": lambda: client.insert("prio", rows(50, 2), timeout=TIMEOUT),
        "iterator": lambda: next(client.sample_iterator("prio", 8, timeout=TIMEOUT)),
    }
    for name, call in calls.items():
        error, took = timed(call)
        assert isinstance(error, ShardUnavailableError) and error.shard == 1, (name, error)
        assert took < LIMIT_S, (name, took)
    # calls without a timeout of their own: within call_timeout
    client.close()
    client = ShardedClient([live_and_killed[0], dead], on_shard_down="fail",
                           **{**SLOW, "call_timeout": TIMEOUT})
    for name, call in {
        "info": lambda: client.info("prio"),
        "describe": lambda: client.describe("prio"),
        "update_priorities": lambda: client.update_priorities(
            "prio", client.keys.to_global(np.arange(2), 1), 1.0),
        "can_sample": lambda: client.can_sample("prio", 1),
    }.items():
        error, took = timed(call)
        assert isinstance(error, ShardUnavailableError), (name, error)
        assert took < TIMEOUT + 1.0, (name, took)
    client.close()


def test_skip_policy_first_call_goes_on_over_the_live_shard_within_its_timeout(
    live_and_killed,
):
    client = ShardedClient([live_and_killed[0], free_address()], on_shard_down="skip",
                           retry_down_s=60.0, **SLOW)
    batch, took = timed(lambda: client.sample("prio", 8, timeout=TIMEOUT))
    assert not isinstance(batch, Exception), batch
    assert took < LIMIT_S and set(batch.data["x"].tolist()) <= set(range(10))
    assert client.health.is_down(1)
    client.close()


def test_a_sample_on_empty_live_shards_times_out_at_its_timeout_not_after_the_grace():
    """The client polls empty shards until the call's own timeout, then raises the rate
    limiter's timeout; the reply grace after it is left to the replies in flight (polling
    into it left the last state probe a few milliseconds, and a loaded shard that
    answered within the grace was taken for one that is down)."""
    with shards([CONFIG] * 2) as started:
        client = ShardedClient([a for a, _ in started], **SLOW)
        try:
            for timeout in (0.05, 0.2):
                error, took = timed(lambda t=timeout: client.sample("prio", 4, timeout=t))
                assert isinstance(error, RateLimiterTimeoutError), error
                assert took < timeout + REPLY_GRACE_S / 2, (timeout, took)
        finally:
            client.close()


@pytest.mark.parametrize(
    ("timeout", "look_s"),
    [(1.0, 0.1), (1.0, 5.0), (0.0, 0.25), (None, 0.25)],
    ids=["short-look", "look-longer-than-the-call", "timeout-0", "no-timeout"],
)
def test_a_greeting_and_its_looks_take_half_the_call_at_most(timeout, look_s):
    """Handshakes, then the looks at silent shards, end within half the time the call has
    left (at most call_timeout), the looks within the greeting's last quarter at most: the
    shards that answer keep the other half."""
    from rlreplay import Client
    from rlreplay.distributed.shard_deadline import Deadline

    client = Client(free_address(), call_timeout=2.0)
    try:
        deadline = Deadline(client.transport, timeout)
        now = time.monotonic()
        handshakes, looks = deadline.greeting(look_s)
        span = min((deadline.bound - now) / 2, 2.0)
        assert looks - now == pytest.approx(span, abs=0.01)
        assert looks - handshakes == pytest.approx(min(look_s, span / 4), abs=0.01)
        assert deadline.bound - looks >= span - 0.01
    finally:
        client.close()
