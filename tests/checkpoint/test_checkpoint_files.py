"""The checkpoint format on disk: pickle-free files, checksums, atomic publishing, keep K,
and restore picking the newest complete, valid checkpoint."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from checkpoint_ops import only_table

from rlreplay import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    InvalidArgumentError,
    Prioritized,
    ReplayTimeoutError,
    Table,
    checkpoint,
)
from rlreplay.checkpoint.manifest import write_manifest

SIG = {"step": "int64", "obs": ((3,), "float32")}


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"step": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)}


def make(n: int = 20) -> Table:
    table = Table("t", signature=SIG, max_size=32, sampler=Prioritized(0.5), seed=3)
    table.insert(rows(0, n), np.linspace(0.1, 2.0, n))
    return table


def test_a_checkpoint_is_npy_files_and_a_manifest_listing_their_sizes_and_checksums(tmp_path):
    table = make()
    path = checkpoint.save(table, tmp_path)
    assert path.parent == tmp_path and path.name == "ckpt-00000001"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == "rlreplay-checkpoint"
    assert manifest["format_version"] == checkpoint.FORMAT_VERSION
    assert manifest["created_at"].endswith("+00:00")
    (store,) = manifest["stores"]
    assert store["capacity"] == 32 and store["state"]["next_id"] == 20
    (saved,) = manifest["tables"]
    assert saved["name"] == "t" and saved["definition"]["sampler"]["type"] == "Prioritized"
    on_disk = {p.name for p in path.iterdir()} - {"manifest.json"}
    assert on_disk == set(manifest["files"])
    for name, info in manifest["files"].items():
        assert name.endswith(".npy")
        assert (path / name).stat().st_size == info["bytes"]
        arr = np.load(path / name, allow_pickle=False, mmap_mode="r")  # no pickle anywhere
        assert list(arr.shape) == info["shape"]
    steps = np.load(path / store["columns"]["step"][0], allow_pickle=False)
    np.testing.assert_array_equal(steps[:20], np.arange(20))


def test_keep_leaves_the_newest_checkpoints(tmp_path):
    table = make()
    paths = [checkpoint.save(table, tmp_path, keep=2) for _ in range(4)]
    assert checkpoint.list_checkpoints(str(tmp_path)) == paths[:1:-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000003", "ckpt-00000004"]


def test_a_temporary_directory_is_never_restored_and_a_dead_saves_one_is_removed(tmp_path):
    table = make()
    first = checkpoint.save(table, tmp_path)
    table.insert(rows(20, 5))
    # A save that died before its rename: a later checkpoint than the published one.
    dead = tmp_path / ".tmp-ckpt-00000002-999999999-abcd"
    dead.mkdir()
    (dead / "manifest.json").write_text("{}")
    assert only_table(tmp_path).store.next_id == 20
    second = checkpoint.save(table, tmp_path)
    assert second.name == "ckpt-00000003" and first.exists() and not dead.exists()


@pytest.mark.parametrize(
    "damage",
    ["truncated_column", "flipped_byte", "missing_file", "no_manifest", "bad_json"],
)
def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(tmp_path, damage):
    table = make()
    checkpoint.save(table, tmp_path)
    table.insert(rows(20, 5))
    newest = checkpoint.save(table, tmp_path)
    manifest = json.loads((newest / "manifest.json").read_text())
    column = newest / manifest["stores"][0]["columns"]["obs"][0]
    if damage == "truncated_column":
        with open(column, "r+b") as f:
            f.truncate(column.stat().st_size - 4)
    elif damage == "flipped_byte":
        data = bytearray(column.read_bytes())
        data[-3] ^= 0xFF
        column.write_bytes(bytes(data))
    elif damage == "missing_file":
        os.remove(newest / "t0.index.priority.npy")
    elif damage == "no_manifest":
        os.remove(newest / "manifest.json")
    else:
        (newest / "manifest.json").write_text('{"format": "rlreplay-checkpoint", ')
    with pytest.warns(UserWarning, match="skipping checkpoint ckpt-00000002"):
        restored = only_table(tmp_path)
    assert restored.store.next_id == 20  # the older, valid one
    with pytest.raises(CheckpointCorruptError, match=r"restore from another checkpoint|damaged"):
        only_table(newest)


def test_a_flipped_byte_in_an_item_array_is_caught_by_its_checksum(tmp_path):
    path = checkpoint.save(make(), tmp_path)
    target = path / "t0.index.sampler.sums.npy"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match="fails its checksum"):
        only_table(path)


def test_a_memory_mapped_restore_checks_sizes_and_can_check_checksums(tmp_path):
    path = checkpoint.save(make(), tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    column = path / manifest["stores"][0]["columns"]["obs"][0]
    data = bytearray(column.read_bytes())
    data[-3] ^= 0xFF
    column.write_bytes(bytes(data))
    assert only_table(path, mmap=True).size == 20  # sizes and headers only, by default
    with pytest.raises(CheckpointCorruptError, match="fails its checksum"):
        only_table(path, mmap=True, verify=True)


def test_another_format_version_is_refused_saying_what_to_do(tmp_path):
    path = checkpoint.save(make(), tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["format_version"] = checkpoint.FORMAT_VERSION + 1
    write_manifest(path, manifest)  # as a later version writes it, checksum and all
    later = checkpoint.FORMAT_VERSION + 1
    with pytest.raises(CheckpointVersionError, match=rf"format version {later}.*rlreplay version"):
        only_table(tmp_path)


def test_no_checkpoint_anywhere_is_a_typed_error_naming_what_was_skipped(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="holds no checkpoint"):
        only_table(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="missing' does not exist"):
        only_table(tmp_path / "missing")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointNotFoundError, match=r"file\.txt' is a file"):
        only_table(tmp_path / "file.txt")
    (tmp_path / "file.txt").unlink()
    path = checkpoint.save(make(), tmp_path)
    os.remove(path / "manifest.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointNotFoundError, match=r"ckpt-00000001: .*no manifest.json"):
            only_table(tmp_path)


@pytest.mark.parametrize(
    "call",
    [
        lambda t, p: checkpoint.save([], p),
        lambda t, p: checkpoint.save([t, t], p),
        lambda t, p: checkpoint.save(t, 42),
        lambda t, p: checkpoint.save(t, p / "file.txt"),
        lambda t, p: checkpoint.save(t, p, keep=0),
        lambda t, p: checkpoint.start_save(t, p, keep="2"),
        lambda t, p: checkpoint.save(t, p, keep=True),
        lambda t, p: checkpoint.save(t, p, keep=2.0),
    ],
    ids=[
        "no_tables", "same_name_twice", "path_not_a_path", "path_a_file", "keep_0",
        "keep_str", "keep_bool", "keep_float",
    ],
)
def test_bad_save_arguments_are_refused_before_anything_is_written(tmp_path, call):
    table = make()
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(InvalidArgumentError):
        call(table, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_a_path_under_a_file_is_a_checkpoint_error_naming_it(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match=r"could not be written into .*file\.txt/sub"):
        checkpoint.save(make(), tmp_path / "file.txt" / "sub")
    assert (tmp_path / "file.txt").read_text() == "x"


def test_keep_takes_any_integer_numpy_s_too(tmp_path):
    table = make()
    for _ in range(3):
        checkpoint.save(table, tmp_path, keep=np.int64(2))
    assert len(checkpoint.list_checkpoints(tmp_path)) == 2


def test_a_closed_table_is_not_saved(tmp_path):
    from rlreplay import ClosedError

    table = make()
    table.close()
    with pytest.raises(ClosedError):
        checkpoint.save(table, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_background_save_returns_its_path_and_its_figures(tmp_path):
    table = make()
    pending = checkpoint.start_save(table, tmp_path, keep=1)
    path = pending.result(timeout=30)
    assert pending.done() and path == Path(tmp_path) / "ckpt-00000001"
    assert pending.stats.bytes == sum(
        p.stat().st_size for p in path.iterdir() if p.suffix == ".npy"
    )
    assert pending.stats.capture_held_s < 1.0


def test_progress_shows_a_bar_when_tqdm_is_installed(tmp_path, capsys):
    pytest.importorskip("tqdm")
    path = checkpoint.save(make(), tmp_path, progress=True)
    only_table(path, progress=True)
    assert "checkpoint" in capsys.readouterr().err


def test_a_save_failing_mid_stream_publishes_nothing_and_leaves_the_store_as_it_was(
    tmp_path, monkeypatch
):
    from rlreplay.checkpoint import streaming

    table = make(20)
    checkpoint.save(table, tmp_path)
    calls = []
    copy_chunk = streaming.ColumnStream._copy_chunk

    def failing(self, r0, r1, out):
        calls.append(r0)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return copy_chunk(self, r0, r1, out)

    monkeypatch.setattr(streaming, "CHUNK_BYTES", 4 * 20)
    monkeypatch.setattr(streaming.ColumnStream, "_copy_chunk", failing)
    table.insert(rows(20, 2))  # a changed chunk: streamed, not reused
    with pytest.raises(OSError, match="No space"):
        checkpoint.save(table, tmp_path)
    assert table.store.observers == ()  # no stream left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000001"]
    table.insert(rows(22, 4))  # the table goes on
    assert only_table(tmp_path).store.next_id == 20


def test_a_memory_mapped_table_keeps_serving_after_its_files_are_pruned(tmp_path):
    path = checkpoint.save(make(20), tmp_path)
    mapped = only_table(path, mmap=True)
    mapped.insert(rows(20, 4))  # copy-on-write: the file does not change
    assert np.load(path / "s0.c0.k000000.npy", allow_pickle=False)[20:24].tolist() == [0] * 4
    checkpoint.save(mapped, tmp_path, keep=1)  # deletes the directory it is mapped from
    assert not path.exists()
    batch = mapped.sample(16)
    np.testing.assert_array_equal(batch.data["obs"][:, 0], batch.data["step"])
    assert only_table(tmp_path).store.next_id == 24


def test_a_memory_mapped_restore_is_not_refused_for_columns_larger_than_free_memory(
    tmp_path, monkeypatch
):
    big = Table(
        "big", signature={"frame": ((1024,), "uint8")}, max_size=4096, capacity=4096, seed=0
    )  # 4 MiB of columns: above the size the memory check looks at
    big.insert({"frame": np.full((8, 1024), 7, np.uint8)})
    path = checkpoint.save(big, tmp_path)
    from rlreplay.core import memory
    from rlreplay.errors import InsufficientMemoryError

    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 20)  # 1 MiB free
    mapped = only_table(path, mmap=True)  # the pages are the file's, not new memory
    assert mapped.size == 8 and int(mapped.sample(4).data["frame"].min()) == 7
    with pytest.raises(InsufficientMemoryError):  # new memory is still checked
        Table("new", signature={"frame": ((1024,), "uint8")}, max_size=4096, capacity=4096)


def test_a_save_still_streaming_times_out_typed_and_a_second_save_of_its_store_is_refused(
    tmp_path,
):
    big = Table("big", signature={"frame": ((64, 64), "float32")}, max_size=4096)
    big.insert({"frame": np.ones((4096, 64, 64), np.float32)})  # 64 MiB to stream
    pending = checkpoint.start_save(big, tmp_path / "a")
    with pytest.raises(ReplayTimeoutError, match="still being written"):
        pending.result(timeout=0)
    with pytest.raises(CheckpointError, match="being written already"):
        checkpoint.save(big, tmp_path / "b")
    assert list((tmp_path / "b").iterdir()) == []  # nothing left behind
    assert pending.result(timeout=60).is_dir()
    assert only_table(tmp_path / "a").size == 4096


def test_a_checkpoint_half_deleted_by_a_dead_process_is_removed_by_the_next_save(tmp_path):
    table = make()
    first = checkpoint.save(table, tmp_path)
    # A prune killed while deleting: its checkpoint renamed away, partly deleted.
    half = tmp_path / ".del-ckpt-00000000-999999999"
    half.mkdir()
    (half / "s0.c0.k000000.npy").write_bytes(b"partial")
    mine = tmp_path / f".del-ckpt-00000007-{os.getpid()}"  # this process deletes it itself
    mine.mkdir()
    assert only_table(tmp_path).store.next_id == 20
    second = checkpoint.save(table, tmp_path, keep=2)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([first.name, second.name, mine.name])


@pytest.mark.parametrize(
    "damage",
    [
        lambda m: m["tables"][0]["state"].pop("index"),
        lambda m: m["stores"][0].pop("columns"),
        lambda m: next(iter(m["files"].values())).pop("crc32"),
        lambda m: m.update(tables={"0": None}),
    ],
    ids=["table state", "store columns", "file checksum", "tables type"],
)
def test_a_manifest_that_parses_but_lacks_entries_is_skipped_as_damaged(tmp_path, damage):
    table = make()
    first = checkpoint.save(table, tmp_path)
    table.insert(rows(20, 5))
    second = checkpoint.save(table, tmp_path)
    manifest = json.loads((second / "manifest.json").read_text())
    damage(manifest)
    write_manifest(second, manifest)  # its own checksum holds: the entries are what is wrong
    with pytest.warns(UserWarning, match="skipping checkpoint ckpt-00000002.*damaged"):
        assert only_table(tmp_path).store.next_id == 20  # the older one, whole
    with pytest.raises(CheckpointCorruptError, match="damaged"):
        only_table(second)
    assert first.exists()
