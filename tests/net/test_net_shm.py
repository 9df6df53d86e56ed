"""Sample replies through shared memory: same data as the socket, held batches never
overwritten, several threads and learners, fallback, and nothing leaked by kill -9."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import numpy as np
import pytest
from netprocs import CTX, config, served
from shm_procs import (
    FRAME_SIGNATURE,
    consistent,
    frames_rows,
    hold_batches,
    shm_entries,
    write_frames,
)

import rlreplay
from rlreplay.errors import (
    ClosedError,
    InvalidArgumentError,
    ProtocolError,
    ServerRestartedError,
)
from rlreplay.net.client import shm, shm_ring
from rlreplay.net.client.shm import is_shared
from rlreplay.net.wire.shm_segments import available
from rlreplay.runtime.stop_flag import StopFlag

pytestmark = pytest.mark.skipif(not available(), reason="needs a writable /dev/shm")

ITEMS = 200


def frames_table(name: str = "frames", **extra) -> dict:
    return {"name": name, "signature": FRAME_SIGNATURE, "capacity": ITEMS, "seed": 7, **extra}


CONFIG = config(frames_table(), frames_table("prio", sampler={"type": "Prioritized"}))


def filled(address: str, **kwargs) -> rlreplay.Client:
    client = rlreplay.Client(address, **kwargs)
    for table in ("frames", "prio"):
        client.insert(table, frames_rows(0, ITEMS))
    return client


def test_batches_equal_the_socket_paths_for_the_same_seed():
    samples = {}
    for mode in (True, False):
        with served(CONFIG) as (address, _):
            client = filled(address, shared_memory=mode)
            it = client.sample_iterator("prio", 32, in_flight=2)
            got = [client.sample("frames", 32) for _ in range(3)]
            for _ in range(3):
                batch = next(it)
                it.update_priorities(batch.info.keys, batch.data["step"] % 5 + 1.0)
                got.append(batch)
            it.close()
            samples[mode] = got
    # the first reply of a table and batch size sizes the slots (two were in flight)
    expected = [False, True, True, False, False, True]
    assert [is_shared(b.data["obs"]) for b in samples[True]] == expected
    assert not any(is_shared(b.data["obs"]) for b in samples[False])
    for a, b in zip(samples[True], samples[False]):
        assert consistent(a) and consistent(b)
        for field in ("obs", "step"):
            np.testing.assert_array_equal(a.data[field], b.data[field])
        np.testing.assert_array_equal(a.info.keys, b.info.keys)
        np.testing.assert_array_equal(a.info.probabilities, b.info.probabilities)
        np.testing.assert_array_equal(a.info.times_sampled, b.info.times_sampled)


def test_a_held_batch_is_never_overwritten_and_a_full_ring_falls_back_to_the_socket():
    with served(CONFIG) as (address, _):
        client = filled(address, shared_memory=True)
        client.sample("frames", 32)
        first = client.sample("frames", 32)
        view = first.data["obs"][::2]  # a view keeps the slot leased too
        expected = view.copy()
        del first
        held = [client.sample("frames", 32) for _ in range(shm.MAX_SLOTS + 3)]
        # a slot overwritten by a later batch would still be consistent (its frames and
        # steps both replaced): compare with copies
        copies = [b.data["step"].copy() for b in held]
        shared = [is_shared(b.data["obs"]) for b in held]
        # one slot holds `view`; the others hold batches, the rest came by socket
        assert shared == [True] * (shm.MAX_SLOTS - 1) + [False] * 4
        assert all(consistent(b) for b in held)
        np.testing.assert_array_equal(view, expected)
        with client.sample_iterator("frames", 32, in_flight=4) as it:
            for _ in range(20):
                batch = next(it)
                assert consistent(batch)
        np.testing.assert_array_equal(view, expected)
        assert all(consistent(b) for b in held)
        for b, steps in zip(held, copies):
            np.testing.assert_array_equal(b.data["step"], steps)
        # dropped batches free their slots: the ring serves again, without growing
        del held, view, batch
        gc.collect()
        again = [client.sample("frames", 32) for _ in range(4)]
        assert all(is_shared(b.data["obs"]) for b in again)
        assert len(client.transport.channel().shm.slots) == shm.MAX_SLOTS


def test_threads_of_one_client_and_a_second_learner_sample_at_once():
    with served(CONFIG) as (address, _):
        client = filled(address)  # automatic on a loopback address
        other = rlreplay.Client(address)
        results, errors = [], []

        def learn(c: rlreplay.Client) -> None:
            try:
                for _ in range(30):
                    batch = c.sample("frames", 24)
                    results.append((is_shared(batch.data["obs"]), consistent(batch)))
            except Exception as exc:  # reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=learn, args=(c,)) for c in (client, client, other)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60.0)
        assert not errors
        assert len(results) == 90 and all(ok for _, ok in results)
        assert sum(shared for shared, _ in results) == 90 - 3  # each thread's first


def test_disabled_or_remote_uses_the_socket_and_required_checks_its_argument():
    with pytest.raises(InvalidArgumentError, match="shared_memory='yes'"):
        rlreplay.Client("tcp://127.0.0.1:5000", shared_memory="yes")
    assert not rlreplay.Client("tcp://10.1.2.3:5000")._shm.enabled
    assert rlreplay.Client("ipc:///tmp/x")._shm.enabled
    with served(CONFIG) as (address, _):
        client = filled(address, shared_memory=False)
        batches = [client.sample("frames", 32) for _ in range(3)]
        assert not any(is_shared(b.data["obs"]) for b in batches)
        assert all(consistent(b) for b in batches)
        assert client.transport.channel().shm is None
        # batches under MIN_BYTES take the socket, where a slot would cost more than it saves
        small = rlreplay.Client(address, shared_memory=True)
        assert shm.MIN_BYTES > 8 * 3072
        batches = [small.sample("frames", 8) for _ in range(3)]
        assert not any(is_shared(b.data["obs"]) for b in batches)
        assert all(consistent(b) for b in batches) and not small.transport.channel().shm.slots


def test_a_server_on_another_host_is_used_through_the_socket(monkeypatch):
    # The server refuses segments of a client whose boot id is not its own.
    monkeypatch.setattr(shm_ring, "boot_id", lambda: "another-host")
    before = shm_entries()
    with served(CONFIG) as (address, _):
        client = filled(address)
        batches = [client.sample("frames", 32) for _ in range(3)]
        assert not any(is_shared(b.data["obs"]) for b in batches)
        assert all(consistent(b) for b in batches)
        assert "another host" in client._shm.failure
        required = rlreplay.Client(address, shared_memory=True)
        required.sample("frames", 32)
        with pytest.raises(InvalidArgumentError, match="shared_memory=True"):
            required.sample("frames", 32)
    assert shm_entries() == before  # refused segments are unlinked too


def test_kill_9_of_a_client_or_of_the_server_leaks_no_segment():
    before = shm_entries()
    with served(CONFIG) as (address, server):
        client = filled(address, shared_memory=True)
        client.sample("frames", 32)
        mine = client.sample("frames", 32)
        assert is_shared(mine.data["obs"])
        out, stop = CTX.Queue(), StopFlag(CTX)
        procs = [
            CTX.Process(target=hold_batches, args=(address, "frames", 3, out, stop))
            for _ in range(2)
        ]
        for p in procs:
            p.start()
        try:
            reports = [out.get(timeout=60.0) for _ in procs]
            assert all(r[0] == "ok" and r[2] and r[3] for r in reports), reports
            assert shm_entries() == before  # attached segments are unlinked at once
            os.kill(procs[0].pid, signal.SIGKILL)
            procs[0].join(10.0)
            assert shm_entries() == before
            # the server goes on serving the others
            assert consistent(client.sample("frames", 32))
            os.kill(server.pid, signal.SIGKILL)
            server.join(10.0)
            assert shm_entries() == before
            # a batch held when the server died stays readable: the memory is this
            # process's mapping now
            assert consistent(mine)
        finally:
            stop.set()
            for p in procs:
                p.join(10.0)
                if p.is_alive():
                    p.kill()
    deadline = time.monotonic() + 5.0
    while shm_entries() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert shm_entries() == before


QUEUE = config(
    {
        "name": "queue",
        "signature": FRAME_SIGNATURE,
        "capacity": 2000,
        "max_size": 400,
        "sampler": {"type": "Fifo"},
        "remover": {"type": "Fifo"},
        "max_times_sampled": 1,
        "rate_limiter": {"type": "Queue", "size": 400},
    }
)
ROWS = 200  # 200 frames of 3 KiB: large enough to travel in shared memory


def test_inserts_and_writer_chunks_travel_in_shared_memory_and_a_parked_one_keeps_its_slot():
    with served(QUEUE) as (address, _):
        client = rlreplay.Client(address, shared_memory=True)
        # two inserts fill the queue; a third, from another thread, is parked by its rate
        # limiter with its rows in that thread's slot, kept until it is answered
        for first in range(0, 2 * ROWS, ROWS):
            client.insert("queue", frames_rows(first, ROWS), timeout=30.0)
        ring = client.transport.channel().shm
        parked_keys: list = []
        parked = threading.Thread(
            target=lambda: parked_keys.append(
                client.insert("queue", frames_rows(2 * ROWS, ROWS), timeout=30.0)
            )
        )
        parked.start()

        def requested() -> bool:
            return any(
                s.state == shm_ring._REQUESTED
                for ch in list(client.transport._channels)
                if ch.shm is not None and ch.shm is not ring
                for s in ch.shm.slots
            )

        deadline = time.monotonic() + 30.0
        while not requested() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert requested()
        reader = rlreplay.Client(address, shared_memory=False)
        steps = []
        for _ in range(6):
            batch = reader.sample("queue", 100, timeout=30.0)
            assert consistent(batch)
            steps.extend(batch.data["step"].tolist())
        parked.join(30.0)
        assert not parked.is_alive() and len(parked_keys[0]) == ROWS
        assert steps == list(range(3 * ROWS))  # every row, in order, none overwritten
        # once acknowledged, the slots serve again: the ring does not grow
        slots = len(ring.slots)
        for first in range(0, 2 * ROWS, ROWS):
            client.insert("queue", frames_rows(first, ROWS))
            assert consistent(reader.sample("queue", ROWS, timeout=30.0))
        assert len(client.transport.channel().shm.slots) == slots
        # a trajectory writer's chunks go the same way
        with client.trajectory_writer("queue", chunk_steps=ROWS) as writer:
            rows = frames_rows(0, 2 * ROWS)
            for i in range(2 * ROWS):
                writer.append({"obs": rows["obs"][i], "step": rows["step"][i]})
                writer.create_item("queue", priority=1.0)
            writer.flush(timeout=30.0)
        got = reader.sample("queue", 2 * ROWS, timeout=30.0)
        assert consistent(got) and got.data["step"].tolist() == list(range(2 * ROWS))


def test_the_server_checks_what_a_request_places_in_shared_memory():
    with served(QUEUE) as (address, _):
        client = rlreplay.Client(address, shared_memory=True)
        client.insert("queue", frames_rows(0, ROWS))  # attaches a slot
        token = client.transport.channel().shm.slots[0].token
        tr = client.transport
        tr.shm = None  # send the requests below as written, as a faulty client would
        cases = {
            "unknown token": ([token + 100, []], InvalidArgumentError, "does not map"),
            "past the slot": (
                [token, [["data/obs", "|u1", [10**6, 12, 12, 3], 0]]],
                ProtocolError,
                "malformed shared-memory entry",
            ),
            "not a pair": ([token], ProtocolError, "shm_in"),
            "not step data": (
                [token, [["priorities", "<f8", [4], 0]]],
                ProtocolError,
                "cannot come through shared memory",
            ),
        }
        for spec, error, match in cases.values():
            header = {"op": "insert", "table": "queue", "shm_in": spec}
            with pytest.raises(error, match=match):
                tr.call(header, {"data/step": np.zeros(1, np.int64)})
        header = {"op": "update_priorities", "table": "queue", "shm_in": [token, []]}
        with pytest.raises(ProtocolError, match="only insert, write"):
            tr.call(header, {"keys": np.zeros(1, np.int64), "priorities": np.ones(1)})
        assert client.info("queue").size == ROWS  # none of them inserted anything


def test_after_a_server_restart_the_client_attaches_new_slots(tmp_path):
    bind = f"ipc://{tmp_path}/server"
    client = rlreplay.Client(bind, shared_memory=True)
    for restarted in (False, True):  # the second server knows nothing of the first's slots
        with served(QUEUE, bind=bind) as (address, _):
            assert address == bind
            for first in (0, ROWS):
                try:
                    keys = client.insert("queue", frames_rows(first, ROWS))
                except ServerRestartedError:  # addressed to the server before
                    keys = client.insert("queue", frames_rows(first, ROWS))
                assert len(keys) == ROWS
            batches = [client.sample("queue", 50, timeout=10.0) for _ in range(4)]
            # the first batch of the first server sizes the slots; the client remembers it
            assert [is_shared(b.data["obs"]) for b in batches] == [restarted, True, True, True]
            assert all(consistent(b) for b in batches)
            assert [int(b.data["step"][0]) for b in batches] == [0, 50, 100, 150]
            del batches  # free slots: the next server must not be sent their old tokens
            gc.collect()


def test_several_writer_processes_and_learners_at_once():
    cfg = config(frames_table("many", capacity=4000))
    with served(cfg) as (address, _):
        out = CTX.Queue()
        writers = [
            CTX.Process(target=write_frames, args=(address, "many", w * 1000, 600, out))
            for w in range(3)
        ]
        for p in writers:
            p.start()
        learner = rlreplay.Client(address, shared_memory=True)
        try:
            checked = 0
            deadline = time.monotonic() + 60.0
            while checked < 40 and time.monotonic() < deadline:
                if learner.info("many").size >= 64:
                    batch = learner.sample("many", 64)
                    assert consistent(batch)
                    checked += 1
            reports = [out.get(timeout=60.0) for _ in writers]
        finally:
            for p in writers:
                p.join(10.0)
                if p.is_alive():
                    p.kill()
        assert all(r[0] == "ok" and r[2] for r in reports), reports
        assert learner.info("many").size == 1800
        everything = learner.sample("many", 1800)
        assert consistent(everything) and checked == 40
        steps = set(everything.data["step"].tolist())
        assert steps <= {w * 1000 + i for w in range(3) for i in range(600)}


def test_the_server_forgets_the_segments_of_a_silent_connection():
    from rlreplay.net.server.shm import SharedSegments
    from rlreplay.net.wire.shm_segments import IDLE_S, Segment, boot_id

    segments, created = SharedSegments(), Segment.create(4096)
    before = shm_entries()
    header = {"name": created.name, "nbytes": 4096, "nonce": created.nonce, "boot_id": boot_id()}
    token = segments.attach(b"client", header, now=100.0)["token"]
    assert created.name not in shm_entries()  # the server unlinked it at once
    assert len(segments) == 1 and segments.target(b"client", token, 100.0).segment is not None
    assert segments.target(b"other", token, 100.0).lost  # another connection's token
    segments.forget_idle(100.0 + IDLE_S / 2)
    assert len(segments) == 1
    segments.forget_idle(100.0 + IDLE_S / 2 + IDLE_S + 1)
    assert len(segments) == 0 and segments.target(b"client", token, 200.0).lost
    assert shm_entries() <= before


FRAME_SPEC = {"obs": ((32, 32, 3), "uint8"), "step": "int64"}


def test_a_sample_gathers_into_the_buffers_it_is_given():
    from rlreplay.net.server.shm import SlotTarget
    from rlreplay.net.wire.shm_segments import Segment

    table = rlreplay.Table("t", signature=FRAME_SPEC, capacity=64, seed=3)
    table.insert(frames_rows(0, 64))
    segment = Segment.create(1 << 20)
    segment.unlink()
    target = SlotTarget(segment)
    batch = table.sample(40, buffers=target)
    header, rest = target.place(batch.data)
    assert not rest and sorted(e[0] for e in header["shm"]) == ["obs", "step"]
    for name, dtype, shape, off in header["shm"]:
        assert np.shares_memory(batch.data[name], segment.data)
        view = segment.data[off:].view(dtype)[: int(np.prod(shape))].reshape(shape)
        np.testing.assert_array_equal(view, batch.data[name])
    assert consistent(batch)
    # a batch larger than the segment: what does not fit is an ordinary array, sent as such
    tiny = Segment.create(4096)
    tiny.unlink()
    small = SlotTarget(tiny)
    header, rest = small.place(table.sample(40, buffers=small).data)
    assert [e[0] for e in header["shm"]] == ["step"] and list(rest) == ["data/obs"]
    assert header["shm_need"] >= 40 * 3072 + 40 * 8


def _segment_file(mode: int, owner: int | None) -> tuple[str, bytes]:
    """A segment file with a valid header, ``mode`` and (as root) ``owner``."""
    from rlreplay.net.wire import shm_segments as seg

    name = f"{seg.PREFIX}{os.getpid()}-{os.urandom(8).hex()}"
    nonce = os.urandom(seg.NONCE_BYTES)
    fd = os.open(os.path.join(seg.SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, seg.HEADER_BYTES + 65536)
        os.write(fd, seg.MAGIC + nonce)
        os.fchmod(fd, mode)
        if owner is not None:
            os.fchown(fd, owner, owner)
    finally:
        os.close(fd)
    return name, nonce


def test_the_server_maps_only_segments_of_its_own_user_closed_to_others():
    from rlreplay.net.wire.shm_segments import SHM_DIR, boot_id

    cases = {"open to others": (0o666, None), "group-readable": (0o640, None)}
    if os.geteuid() == 0:  # a server running as root opens any user's file
        cases["another user's"] = (0o600, 54321)
    with served(QUEUE) as (address, _):
        tr = rlreplay.Client(address, shared_memory=False).transport
        for mode, owner in cases.values():
            name, nonce = _segment_file(mode, owner)
            try:
                header = {"op": "shm_attach", "name": name, "nbytes": 65536, "nonce": nonce,
                          "boot_id": boot_id()}
                with pytest.raises(InvalidArgumentError, match="mode 600"):
                    tr.call(header)
            finally:
                if os.path.exists(os.path.join(SHM_DIR, name)):
                    os.unlink(os.path.join(SHM_DIR, name))
        name, nonce = _segment_file(0o600, None)  # the client's own: mapped
        header = {"op": "shm_attach", "name": name, "nbytes": 65536, "nonce": nonce,
                  "boot_id": boot_id()}
        assert tr.call(header)[0]["token"] >= 1
        assert not os.path.exists(os.path.join(SHM_DIR, name))  # the server unlinked it


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_batch_held_across_a_fork_is_never_overwritten_in_the_child():
    # The slot's memory is shared with a forked child (not copied on write): once the
    # parent drops the batch its slot is retired, never leased again.
    with served(QUEUE) as (address, _):
        client = rlreplay.Client(address, shared_memory=True)
        client.insert("queue", frames_rows(0, ROWS))
        client.sample("queue", 32, timeout=10.0)
        batch = client.sample("queue", 32, timeout=10.0)
        assert is_shared(batch.data["obs"])
        expected = batch.data["step"].copy()
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child reads its inherited batch once the parent sampled more
            try:
                os.read(to_child, 1)
                same = np.array_equal(batch.data["step"], expected) and consistent(batch)
                os.write(from_child, b"1" if same else b"0")
            finally:
                os._exit(0)
        try:
            del batch
            gc.collect()
            later = [client.sample("queue", 32, timeout=10.0) for _ in range(3)]
            del later
            gc.collect()
            assert is_shared(client.sample("queue", 32, timeout=10.0).data["obs"])
            os.write(from_parent, b"x")
            assert os.read(to_parent, 1) == b"1"
        finally:
            os.waitpid(pid, 0)
            for fd in (to_child, from_parent, to_parent, from_child):
                os.close(fd)


def test_a_full_dev_shm_sends_through_the_socket_until_a_slot_fits_again(monkeypatch):
    # A container's /dev/shm (64 MiB by default) may be full for a while: the requests
    # meanwhile take the socket, and shared memory serves again once a slot fits.
    import errno

    real = os.posix_fallocate

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shm, "NO_ROOM_RETRY_S", 0.2)
    with served(CONFIG) as (address, _):
        filled(address)
        client = rlreplay.Client(address)  # no slot yet
        client.sample("frames", 32)  # the first reply sizes the slots
        monkeypatch.setattr(os, "posix_fallocate", full)
        batches = [client.sample("frames", 32) for _ in range(2)]
        assert not any(is_shared(b.data["obs"]) for b in batches)
        assert all(consistent(b) for b in batches)
        assert "No space left" in client._shm.failure
        monkeypatch.setattr(os, "posix_fallocate", real)
        time.sleep(0.3)
        assert is_shared(client.sample("frames", 32).data["obs"])
        assert client._shm.enabled


def server_slots(pid: int) -> set[str]:
    """Names of this library's segments that process ``pid`` maps now."""
    with open(f"/proc/{pid}/maps") as maps:
        return {
            line.split("/dev/shm/")[1].split()[0]
            for line in maps
            if "/dev/shm/rlreplay-" in line
        }


def wait_for(check, seconds: float = 5.0) -> bool:
    """Whether ``check()`` became true within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_a_closed_client_has_the_server_unmap_its_slots_at_once():
    with served(CONFIG) as (address, proc):
        filled(address).close()
        assert wait_for(lambda: not server_slots(proc.pid))
        own = server_slots(os.getpid())
        client = rlreplay.Client(address, shared_memory=True)
        client.sample("frames", 32)
        held = [client.sample("frames", 32) for _ in range(4)]
        assert all(is_shared(b.data["obs"]) for b in held)
        assert len(server_slots(proc.pid)) >= 4
        client.close()
        del held
        gc.collect()
        # well before the server forgets idle segments (IDLE_S), and without a reply
        assert wait_for(lambda: not server_slots(proc.pid))
        assert server_slots(os.getpid()) <= own  # the client's own mappings went too
        with pytest.raises(ClosedError):  # closed for good
            client.sample("frames", 32)
        again = rlreplay.Client(address, shared_memory=True)
        again.sample("frames", 32)  # a new client: this sizes its slots
        assert is_shared(again.sample("frames", 32).data["obs"])
        again.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_the_slots_of_a_thread_that_ended_are_released():
    with served(CONFIG) as (address, proc):
        client = filled(address, shared_memory=True)
        client.sample("frames", 32)
        assert is_shared(client.sample("frames", 32).data["obs"])
        gc.collect()
        mine = server_slots(proc.pid)
        shared = []

        def learn() -> None:
            for _ in range(3):
                shared.append(is_shared(client.sample("frames", 32).data["obs"]))

        for _ in range(3):
            t = threading.Thread(target=learn)
            t.start()
            t.join(30.0)
        assert shared == [False, True, True] * 3  # each thread's first sizes its slots
        assert wait_for(lambda: server_slots(proc.pid) <= mine)
        assert is_shared(client.sample("frames", 32).data["obs"])  # the main thread's stay
        client.close()


def test_the_process_slot_budget_sends_past_it_through_the_socket(monkeypatch):
    with served(CONFIG) as (address, _):
        filled(address).close()
        client = rlreplay.Client(address)
        client.sample("frames", 32)  # the first reply sizes the slots
        need = client.transport.channel().shm.need[("frames", 32)]
        slot_bytes = -(-need // shm_ring.SLOT_ROUNDING) * shm_ring.SLOT_ROUNDING
        gc.collect()
        budget = shm_ring.budget_bytes()
        monkeypatch.setattr(shm_ring.BUDGET, "limit", shm_ring.BUDGET.used + 2 * slot_bytes)
        held = [client.sample("frames", 32) for _ in range(5)]
        assert [is_shared(b.data["obs"]) for b in held] == [True, True, False, False, False]
        assert all(consistent(b) for b in held)
        del held
        gc.collect()
        again = [client.sample("frames", 32) for _ in range(2)]  # freed slots serve again
        assert all(is_shared(b.data["obs"]) for b in again)
        monkeypatch.setattr(shm_ring.BUDGET, "limit", budget)
        client.close()


@pytest.mark.parametrize(
    "value, expected",
    [("1000", 1000), ("0", 1 << 62), ("lots", None), ("-5", None)],
)
def test_the_slot_budget_variable_is_checked_when_a_client_is_made(monkeypatch, value, expected):
    monkeypatch.setattr(shm_ring.BUDGET, "limit", None)
    monkeypatch.setenv(shm_ring.BUDGET_VARIABLE, value)
    if expected is None:
        with pytest.raises(InvalidArgumentError, match=shm_ring.BUDGET_VARIABLE):
            rlreplay.Client("ipc:///tmp/rlreplay-budget-test", shared_memory=True)
        assert shm_ring.BUDGET.limit is None
    else:
        rlreplay.Client("ipc:///tmp/rlreplay-budget-test", shared_memory=True).close()
        assert shm_ring.budget_bytes() == expected
    monkeypatch.delenv(shm_ring.BUDGET_VARIABLE)
    monkeypatch.setattr(shm_ring.BUDGET, "limit", None)
    st = os.statvfs("/dev/shm")
    default = min(shm_ring.DEFAULT_BUDGET_BYTES, st.f_bavail * st.f_frsize // 4)
    assert abs(shm_ring.budget_bytes() - default) <= 64 << 20
