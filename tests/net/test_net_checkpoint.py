"""Server checkpoints: on request and periodic (keeping the newest K), restored at start
(refused when they do not match the served tables), from the command line, and taken
while the server goes on serving."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from checkpoint_procs import check_checkpoint, config, server_process, start_server

import rlreplay
from rlreplay.checkpoint import list_checkpoints
from rlreplay.errors import CheckpointMismatchError, InvalidArgumentError

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(n: int, start: int = 0) -> dict:
    i = np.arange(start, start + n)
    return {"x": i.astype(np.float32)}


def row_table(name: str = "t", max_size: int = 1000) -> rlreplay.Table:
    return rlreplay.Table(name, signature={"x": "float32"}, max_size=max_size, seed=1)


def test_checkpoint_asked_by_a_client_is_restored_by_the_next_server(tmp_path):
    port, ckpt = free_port(), str(tmp_path / "ckpt")
    with server_process(config(), port, checkpoint_dir=ckpt) as (_, address, restored):
        assert restored is None
        client = rlreplay.Client(address)
        with client.trajectory_writer("seq", chunk_steps=8) as w:
            for i in range(30):
                w.append({"obs": np.array([1, i, 0], np.float32), "step": np.int64(i)})
                if i >= 2:
                    w.create_item("seq", 1.0)
        sampled = client.sample("seq", 5, timeout=5.0)
        client.update_priorities("seq", sampled.info.keys, np.full(5, 7.0))
        path = client.checkpoint(timeout=30.0)
        info = client.info("seq")
        client.close()
    assert Path(path).parent == Path(ckpt) and Path(path, "manifest.json").is_file()
    with server_process(config(), port, checkpoint_dir=ckpt) as (_, address, restored):
        assert restored == path
        client = rlreplay.Client(address)
        again = client.info("seq")
        assert (again.size, again.inserts, again.samples) == (info.size, info.inserts, 5)
        # keys issued before the restart still name the same items
        unique = len(set(sampled.info.keys.tolist()))  # drawn with replacement
        assert client.update_priorities("seq", sampled.info.keys, np.ones(5)) == unique
        client.close()


def test_periodic_checkpoints_keep_the_newest_k(tmp_path):
    ckpt = tmp_path / "ckpt"
    table = row_table()
    with rlreplay.Server([table], checkpoint_dir=ckpt, checkpoint_every_s=0.2, keep_checkpoints=2):
        for k in range(20):
            table.insert(rows(5, 5 * k))
            time.sleep(0.05)
        deadline = time.monotonic() + 10.0
        while len(list_checkpoints(ckpt)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    kept = list_checkpoints(ckpt)
    assert len(kept) == 2 and all(p.name.startswith("ckpt-") for p in kept)
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".tmp")]
    fresh = row_table()
    with rlreplay.Server([fresh], checkpoint_dir=ckpt) as server:
        assert server.checkpoints.restored_from == kept[0]  # the newest
        assert 0 < fresh.size <= 100


def test_server_stops_with_the_checkpoint_under_way_published(tmp_path):
    ckpt = tmp_path / "ckpt"
    table = row_table()
    table.insert(rows(100))
    server = rlreplay.Server([table], checkpoint_dir=ckpt).start()
    client = rlreplay.Client(server.address)
    client.checkpoint(timeout=30.0)
    server.stop()
    assert len(list_checkpoints(ckpt)) == 1
    client.close()


def test_two_checkpoints_asked_at_once_are_each_published(tmp_path):
    table = row_table()
    table.insert(rows(50))
    with rlreplay.Server([table], checkpoint_dir=tmp_path / "ckpt") as server:
        paths: list = []

        def ask():
            client = rlreplay.Client(server.address)
            paths.append(client.checkpoint(timeout=30.0))
            client.close()

        threads = [threading.Thread(target=ask) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60.0)
    assert len(set(paths)) == 2 and all(Path(p, "manifest.json").is_file() for p in paths)


def test_checkpoint_of_a_server_without_a_directory_is_refused_naming_the_option():
    with rlreplay.Server([row_table()]) as server:
        client = rlreplay.Client(server.address)
        with pytest.raises(InvalidArgumentError, match="checkpoint_dir"):
            client.checkpoint(timeout=5.0)
        client.close()


BAD_OPTIONS = {
    "period_without_directory": ({"checkpoint_every_s": 1.0}, "need checkpoint_dir"),
    "keep_without_directory": ({"keep_checkpoints": 2}, "need checkpoint_dir"),
    "zero_period": ({"checkpoint_dir": "d", "checkpoint_every_s": 0}, "checkpoint_every_s=0"),
    "nan_period": ({"checkpoint_dir": "d", "checkpoint_every_s": float("nan")}, "> 0"),
    "zero_keep": ({"checkpoint_dir": "d", "keep_checkpoints": 0}, "keep_checkpoints=0"),
    "float_keep": ({"checkpoint_dir": "d", "keep_checkpoints": 1.5}, "int >= 1"),
    "directory_not_a_path": ({"checkpoint_dir": 3}, "checkpoint_dir=3"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_server_refuses_bad_checkpoint_options(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kwargs, words = BAD_OPTIONS[case]
    with pytest.raises(InvalidArgumentError, match=words.replace("(", r"\(")):
        rlreplay.Server([row_table()], **kwargs)
    assert not (tmp_path / "d").exists()


def test_server_refuses_a_directory_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(InvalidArgumentError, match="is a file"):
        rlreplay.Server([row_table()], checkpoint_dir=tmp_path / "f")


def test_server_refuses_at_start_a_directory_it_cannot_create(tmp_path):
    (tmp_path / "f").write_text("")
    server = rlreplay.Server([row_table()], checkpoint_dir=tmp_path / "f" / "ckpts")
    with pytest.raises(InvalidArgumentError, match="cannot be created"):
        server.start()  # not at its first checkpoint, minutes later
    assert server.address is None


def test_server_creates_its_checkpoint_directory_at_start(tmp_path):
    with rlreplay.Server([row_table()], checkpoint_dir=tmp_path / "a" / "b"):
        assert (tmp_path / "a" / "b").is_dir()


def test_checkpoint_of_other_tables_is_refused_at_start_and_nothing_is_served(tmp_path):
    ckpt = tmp_path / "ckpt"
    table = row_table(max_size=1000)
    table.insert(rows(10))
    with rlreplay.Server([table], checkpoint_dir=ckpt) as server:
        rlreplay.Client(server.address).checkpoint(timeout=30.0)
    other = row_table(max_size=500)
    server = rlreplay.Server([other], checkpoint_dir=ckpt)
    with pytest.raises(CheckpointMismatchError, match="max_size") as info:
        server.start()
    assert server.address is None and other.size == 0
    # A server takes no adapt=: the message says what a server's user can do instead.
    assert "A server restores into the tables it serves and takes no adapt=" in str(info.value)
    assert str(ckpt) in str(info.value)


def test_serving_goes_on_while_a_checkpoint_is_written(tmp_path):
    """A 64 MiB store: sample calls keep being answered while its columns stream."""
    table = rlreplay.Table("big", signature={"frame": ((64, 64), "float32")}, max_size=4096, seed=1)
    table.insert({"frame": np.ones((4096, 64, 64), np.float32)})
    with rlreplay.Server([table], checkpoint_dir=tmp_path / "ckpt") as server:
        client = rlreplay.Client(server.address)
        done = threading.Event()
        latencies: list[float] = []
        during: list[int] = []

        def sample_loop():
            learner = rlreplay.Client(server.address)
            deadline = time.monotonic() + 60.0
            while not done.is_set() and time.monotonic() < deadline:
                start = time.monotonic()
                learner.sample("big", 4, timeout=5.0)
                latencies.append(time.monotonic() - start)
            learner.close()

        learner = threading.Thread(target=sample_loop)
        learner.start()
        time.sleep(0.2)
        before = len(latencies)
        path = client.checkpoint(timeout=60.0)
        during.append(len(latencies) - before)
        done.set()
        learner.join(30.0)
        client.close()
    assert Path(path, "manifest.json").is_file()
    assert during[0] > 0  # samples were answered while the checkpoint was written
    assert max(latencies) < 2.0


def test_rlreplay_serve_restores_and_saves_and_rlreplay_checkpoint_asks_for_one(tmp_path):
    conf = tmp_path / "tables.toml"
    conf.write_text(
        '[[table]]\nname = "seq"\nmax_size = 1000\nseed = 3\n'
        'signature = { obs = { shape = [3], dtype = "float32" }, step = "int64" }\n'
        'layout = { type = "sequence", length = 3 }\n'
    )
    ckpt = tmp_path / "ckpt"
    port = free_port()
    serve = [sys.executable, "-m", "rlreplay.cli", "serve", "--config", str(conf), "--port",
             str(port), "--checkpoint-dir", str(ckpt), "--checkpoint-every", "60",
             "--keep", "1"]  # fmt: skip

    def start() -> tuple[subprocess.Popen, list[str]]:
        proc = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ENV)  # fmt: skip
        lines = []
        for _ in range(2):
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("serving") or not line:
                break
        assert lines[-1].startswith("serving"), (lines, proc.poll())
        return proc, lines

    proc, lines = start()
    try:
        assert len(lines) == 1  # nothing restored
        address = lines[0].split(" on ")[1].strip()
        client = rlreplay.Client(address)
        with client.trajectory_writer("seq", chunk_steps=4) as w:
            for i in range(10):
                w.append({"obs": np.array([1, i, 0], np.float32), "step": np.int64(i)})
                if i >= 2:
                    w.create_item("seq")
        client.close()
        asked = subprocess.run(
            [sys.executable, "-m", "rlreplay.cli", "checkpoint", address, "--timeout", "30"],
            capture_output=True, text=True, timeout=60, env=ENV,
        )  # fmt: skip
        assert asked.returncode == 0, asked.stderr
        path = asked.stdout.strip()
        assert Path(path).parent == ckpt
    finally:
        proc.kill()  # kill -9: the checkpoint on disk is what remains
        proc.wait(10.0)
        proc.stdout.close()
        proc.stderr.close()
    proc, lines = start()
    try:
        assert lines[0].strip() == f"restored {path}"
        assert check_checkpoint(path, {})["items"] == 8
    finally:
        proc.terminate()
        proc.wait(15.0)
        proc.stdout.close()
        proc.stderr.close()


CLI_MISTAKES = {
    "keep_without_directory": (["--keep", "2"], 2, "--keep needs --checkpoint-dir"),
    "period_without_directory": (["--checkpoint-every", "5"], 2, "--checkpoint-every needs"),
    "both_without_directory": (
        ["--checkpoint-every", "5", "--keep", "2"], 2, "--checkpoint-every and --keep need --"
    ),
    "negative_period": (["--checkpoint-dir", "d", "--checkpoint-every", "-1"], 2, "-1 must be"),
}


@pytest.mark.parametrize("case", sorted(CLI_MISTAKES))
def test_serve_checkpoint_flag_mistakes_are_one_line(tmp_path, case):
    conf = tmp_path / "tables.toml"
    conf.write_text('[[table]]\nname = "t"\nmax_size = 10\nsignature = { x = "float32" }\n')
    flags, code, words = CLI_MISTAKES[case]
    result = subprocess.run(
        [sys.executable, "-m", "rlreplay.cli", "serve", "--config", str(conf), *flags],
        capture_output=True, text=True, timeout=60, env=ENV, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines


def test_rlreplay_checkpoint_of_a_server_without_a_directory_exits_2():
    with rlreplay.Server([row_table()]) as server:
        result = subprocess.run(
            [sys.executable, "-m", "rlreplay.cli", "checkpoint", server.address],
            capture_output=True, text=True, timeout=60, env=ENV,
        )  # fmt: skip
    assert result.returncode == 2
    assert "--checkpoint-dir" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_restart_keeps_serving_the_same_address_for_a_restored_process(tmp_path):
    """The process restarted on the same port restores the checkpoint the first saved."""
    port, ckpt = free_port(), str(tmp_path / "ckpt")
    proc, address, _ = start_server(config(), port, checkpoint_dir=ckpt)
    try:
        client = rlreplay.Client(address)
        client.checkpoint(timeout=30.0)
        client.close()
    finally:
        proc.kill()
        proc.join(10.0)
    proc, again, restored = start_server(config(), port, checkpoint_dir=ckpt)
    try:
        assert again == address and restored is not None
    finally:
        proc.kill()
        proc.join(10.0)


def test_rlreplay_checkpoint_of_a_dead_address_says_nothing_is_listening():
    address = f"tcp://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "rlreplay.cli", "checkpoint", address, "--timeout", "1"],
        capture_output=True, text=True, timeout=60, env=ENV,
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("rlreplay checkpoint: error:") and address in lines[0]


def test_checkpoint_that_cannot_be_written_is_answered_with_checkpoint_error(tmp_path):
    table = row_table()
    table.insert(rows(10))
    with rlreplay.Server([table], checkpoint_dir=tmp_path / "taken" / "ckpt") as server:
        (tmp_path / "taken" / "ckpt").rmdir()  # made at start; taken away since
        (tmp_path / "taken").rmdir()
        (tmp_path / "taken").write_text("a file where the directory should go")
        client = rlreplay.Client(server.address)
        with pytest.raises(rlreplay.CheckpointError, match="could not be written") as info:
            client.checkpoint(timeout=30.0)
        assert str(tmp_path / "taken" / "ckpt") in str(info.value)  # says where
        assert client.info("t").size == 10  # and the server goes on serving
        client.close()
        assert server.checkpoints.failures == 1


def test_checkpoint_asked_during_an_in_process_save_waits_for_it_while_serving(tmp_path):
    """A save of the same tables in the server's process (streaming a 64 MiB store) is
    waited for by the server's checkpoint without holding up other requests."""
    table = rlreplay.Table("big", signature={"frame": ((64, 64), "float32")}, max_size=4096)
    table.insert({"frame": np.ones((4096, 64, 64), np.float32)})
    with rlreplay.Server([table], checkpoint_dir=tmp_path / "served") as server:
        client = rlreplay.Client(server.address)
        client.ping()
        began = time.monotonic()
        local = rlreplay.checkpoint.start_save([table], tmp_path / "local")
        asked: list = []
        waiter = threading.Thread(target=lambda: asked.append(client.checkpoint(timeout=60.0)))
        waiter.start()
        other = rlreplay.Client(server.address)
        start = time.monotonic()
        assert other.info("big").size == 4096  # answered while both saves are under way
        assert time.monotonic() - start < 2.0
        assert local.result(60.0).is_dir()
        local_s = time.monotonic() - began
        waiter.join(60.0)
        assert Path(asked[0], "manifest.json").is_file()
        other.close()
        client.close()
        # the dispatcher waited for the local save between requests, never inside one
        assert server.checkpoints.longest_capture_s < local_s / 2, local_s


def test_checkpoint_during_an_in_process_save_of_other_tables_does_not_wait_for_it(tmp_path):
    """A save of a table the server does not serve (streaming a 64 MiB store in the same
    process) neither holds up the server's dispatcher nor its checkpoint."""
    other_table = rlreplay.Table("big", signature={"frame": ((64, 64), "float32")}, max_size=4096)
    other_table.insert({"frame": np.ones((4096, 64, 64), np.float32)})
    table = row_table()
    table.insert(rows(10))
    with rlreplay.Server([table], checkpoint_dir=tmp_path / "served") as server:
        client = rlreplay.Client(server.address)
        client.ping()
        began = time.monotonic()
        local = rlreplay.checkpoint.start_save([other_table], tmp_path / "local")
        path = client.checkpoint(timeout=60.0)
        asked_s = time.monotonic() - began
        assert local.result(60.0).is_dir()
        local_s = time.monotonic() - began
        assert Path(path, "manifest.json").is_file()
        client.close()
        # neither the capture nor the checkpoint waited for the other save to be written
        assert server.checkpoints.longest_capture_s < local_s / 2, local_s
        assert asked_s < local_s, (asked_s, local_s)
