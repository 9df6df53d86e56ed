"""A server restarted from its checkpoint while clients run: clients get typed errors
within their timeouts while it is down and go on when it is back on the same address;
writers send again what was not acknowledged and nothing is stored twice. Real server
processes killed with SIGKILL."""

from __future__ import annotations

import time

import numpy as np
import pytest
from checkpoint_procs import (
    CTX,
    EPISODE,
    SPAN,
    TYPED,
    check_checkpoint,
    config,
    kill,
    sample_until,
    server_process,
    start_server,
    step,
    write_steps,
)
from netprocs import free_port

import rlreplay
from rlreplay.errors import InvalidArgumentError, ServerRestartedError
from rlreplay.runtime.stop_flag import StopFlag


def wait_for(condition, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    for _ in range(int(limit_s / 0.05) + 1):
        if condition():
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    raise AssertionError(f"{what} within {limit_s}s")


def call_after_restart(call):
    """``call()``, once more if it was addressed to the server before the restart."""
    try:
        return call()
    except ServerRestartedError:
        return call()


def test_writers_and_samplers_go_on_across_a_restart_from_the_checkpoint(tmp_path):
    port, ckpt = free_port(), tmp_path / "ckpt"
    cfg = config()
    out, stop = CTX.Queue(), StopFlag(CTX)
    proc, address, restored = start_server(cfg, port, checkpoint_dir=str(ckpt))
    assert restored is None  # nothing to restore yet
    writers = [
        CTX.Process(target=write_steps, args=(address, w, 600, out, 90.0, None, 0.01), daemon=True)
        for w in (1, 2)
    ]
    sampler = CTX.Process(target=sample_until, args=(address, stop, out, 90.0), daemon=True)
    client = rlreplay.Client(address, call_timeout=2.0, liveness_s=0.5)
    try:
        for p in (*writers, sampler):
            p.start()
        # writers see acknowledgements a few chunks behind (4 in flight): let some come
        wait_for(lambda: client.info("seq").size >= 200, 30.0, "writers stored 200 items")
        asked = time.time()
        first = client.checkpoint(timeout=30.0)
        size_then = client.info("seq").size
        wait_for(lambda: client.info("seq").size >= size_then + 30, 30.0, "more items stored")
        kill(proc)  # SIGKILL: items acknowledged since the checkpoint are lost with it
        time.sleep(1.0)  # clients fail their calls meanwhile
        proc, _, restored = start_server(cfg, port, checkpoint_dir=str(ckpt))
        assert restored == first
        got = [out.get(timeout=120.0) for _ in writers]  # the sampler runs until stop ...
        stop.set()
        got.append(out.get(timeout=30.0))  # ... unless it failed: then it came first
        results = [r for r in got if len(r) == 6]  # writers report 6 fields, the sampler 5
        sampled = next(r for r in got if len(r) == 5)
        final = call_after_restart(lambda: client.checkpoint(timeout=30.0))
    finally:
        stop.set()
        kill(proc)
        for p in (*writers, sampler):
            p.join(10.0)
            if p.is_alive():
                p.kill()
        client.close()
    acks = {}
    for status, writer, log, errors, slowest, refused in results:
        assert status == "ok", log
        assert set(errors) <= {*TYPED, "InvalidArgumentError"}, errors
        assert slowest < 4.0  # a failing call gave up within its timeout (1 s) and grace
        assert refused <= 1  # at most the chunk whose items reached the lost steps
        assert log[-1][1] > 0
        acks[writer] = log
    status, n_sampled, bad, errors, slowest = sampled
    assert status == "ok" and bad == 0 and n_sampled > 0
    assert set(errors) <= set(TYPED) and errors, errors  # it saw the server go away
    assert slowest < 4.0
    # The checkpoint holds everything acknowledged before it was asked for, once ...
    before = check_checkpoint(first, acks, before=asked)
    assert before["acked_before"] >= 50 and before["missing"] == 0
    assert before["duplicates"] == 0 and before["bad"] == 0
    # ... and so does the server restored from it, which then took the writers' rest
    after = check_checkpoint(final, acks, before=asked)
    assert after["missing"] == 0 and after["duplicates"] == 0 and after["bad"] == 0
    assert after["items"] > before["items"]


# ---------------------------------------------------------- chunks sent again, raw
WRITER = b"w" * 16


def chunk(seq: int, first: int, n: int, anchors: list[int], **header) -> tuple[dict, dict]:
    """A raw ``write`` request of writer ``WRITER``: steps ``first .. first + n - 1`` and
    one item of table ``seq`` at each anchor."""
    steps = [step(7, i) for i in range(first, first + n)]
    arrays = {
        "data/obs": np.stack([s["obs"] for s in steps]),
        "data/step": np.array([s["step"] for s in steps]),
        "item_table": np.zeros(len(anchors), np.int32),
        "item_anchor": np.asarray(anchors, np.int64),
        "item_priority": np.ones(len(anchors)),
    }
    head = {"op": "write", "writer": WRITER, "tables": ["seq"], "history": 8, "seq": seq,
            "first": first, "n": n, "timeout": 5.0, **header}  # fmt: skip
    return head, arrays


def send(client: rlreplay.Client, request: tuple[dict, dict]) -> np.ndarray:
    head, arrays = request
    sender = client.transport
    return call_after_restart(lambda: sender.wait(sender.send(dict(head), arrays), 10.0)[1])["keys"]


def test_chunk_applied_before_the_checkpoint_and_sent_again_is_answered_not_applied_again(
    tmp_path,
):
    port, ckpt = free_port(), str(tmp_path / "ckpt")
    with server_process(config(), port, checkpoint_dir=ckpt) as (_, address, _):
        client = rlreplay.Client(address)
        send(client, chunk(0, 0, 4, [0, 1]))
        lost_reply = send(client, chunk(1, 4, 4, [2, 3, 4, 5]))  # as if its reply was lost
        client.checkpoint(timeout=30.0)
        client.close()
    with server_process(config(), port, checkpoint_dir=ckpt) as (_, address, restored):
        assert restored is not None
        client = rlreplay.Client(address)
        assert client.info("seq").size == 6
        again = send(client, chunk(1, 4, 4, [2, 3, 4, 5]))
        assert again.tolist() == lost_reply.tolist()  # the first reply, nothing applied
        assert client.info("seq").size == 6
        # the next chunk continues the episode: its items reach the retained steps 6, 7
        send(client, chunk(2, 8, 2, [6, 7]))
        assert client.info("seq").size == 8
        s = client.sample("seq", 64, timeout=5.0)
        assert sorted(set(s.data["step"][:, 0].tolist())) == list(range(8))
        assert (np.diff(s.data["step"], axis=1) == 1).all()
        client.close()


def test_chunks_lost_with_the_server_after_its_checkpoint_start_a_new_episode(tmp_path):
    port, ckpt = free_port(), str(tmp_path / "ckpt")
    with server_process(config(), port, checkpoint_dir=ckpt) as (_, address, _):
        client = rlreplay.Client(address)
        send(client, chunk(0, 0, 4, [0, 1]))
        client.checkpoint(timeout=30.0)
        send(client, chunk(1, 4, 4, [2, 3, 4, 5]))  # acknowledged, then lost with the server
        client.close()
    with server_process(config(), port, checkpoint_dir=ckpt) as (_, address, _):
        client = rlreplay.Client(address)
        assert client.info("seq").size == 2
        # the writer's next chunk: its items reach steps 6, 7 of the lost chunk: refused
        with pytest.raises(InvalidArgumentError, match="outside this writer's steps"):
            send(client, chunk(2, 8, 4, [6, 7, 8, 9]))
        assert client.info("seq").size == 2
        # the writer drops it and goes on as a new episode, with the same number
        send(client, chunk(2, 12, 4, [12, 13], restart=True))
        send(client, chunk(3, 16, 4, [14, 15, 16, 17]))  # and continues it
        assert client.info("seq").size == 8
        s = client.sample("seq", 64, timeout=5.0)
        assert set(s.data["step"][:, 0].tolist()) == {0, 1, 12, 13, 14, 15, 16, 17}
        assert (np.diff(s.data["step"], axis=1) == 1).all()
        client.close()


def test_remote_writer_continues_after_a_restart_without_storing_an_item_twice(tmp_path):
    """The RemoteTrajectoryWriter itself: chunks it had not seen acknowledged when the
    server was killed go again to the restored server; every item is stored once."""
    port, ckpt = free_port(), str(tmp_path / "ckpt")
    proc, address, _ = start_server(config(), port, checkpoint_dir=ckpt)
    client = rlreplay.Client(address, call_timeout=1.0, liveness_s=0.5)
    try:
        w = client.trajectory_writer("seq", chunk_steps=8, max_in_flight=8, timeout=1.0)
        for i in range(2 * EPISODE):
            w.append(step(5, i))
            if i % EPISODE >= SPAN - 1:
                w.create_item("seq", 1.0)
            if (i + 1) % EPISODE == 0:
                w.end_episode()
        w.flush(timeout=10.0)
        client.checkpoint(timeout=30.0)
        for i in range(2 * EPISODE, 2 * EPISODE + 10):  # buffered and sent, not yet flushed
            w.append(step(5, i))
            w.create_item("seq", 1.0) if i % EPISODE >= SPAN - 1 else None
        kill(proc)
        proc, _, _ = start_server(config(), port, checkpoint_dir=ckpt)
        deadline = time.monotonic() + 30.0
        while True:  # the flush that failed while the server was down is repeated
            try:
                w.flush(timeout=2.0)
                break
            except (rlreplay.ReplayTimeoutError, InvalidArgumentError):
                assert time.monotonic() < deadline
        w.close()
        s = call_after_restart(lambda: client.sample("seq", 512, timeout=5.0))
        anchors = s.data["step"][:, 0]
        assert (np.diff(s.data["step"], axis=1) == 1).all()
        held = client.info("seq").size
        per_episode = EPISODE - SPAN + 1
        assert held >= 2 * per_episode  # everything flushed before the checkpoint
        assert len(set(anchors.tolist())) == held  # each anchor once (uniform, 512 draws)
    finally:
        kill(proc)
        client.close()
