"""Incremental checkpoints: a save reuses (hard-links) the previous checkpoint's files of
the chunks no write changed since, each checkpoint stays complete on its own, and a
restore gives back exactly what was saved."""

from __future__ import annotations

import copy
import errno
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from checkpoint_ops import CONFIGS, KINDS, only_table, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlreplay import Fifo, Table, Uniform, checkpoint
from rlreplay.checkpoint import increments
from rlreplay.checkpoint.save import SaveStats
from rlreplay.core import store_changes

SIG = {"obs": ((60,), "uint8"), "reward": "float32"}  # 64 bytes a row
CHUNK_ROWS = 1024  # with 64 KB chunks: the fewest rows whose bytes are whole pages


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n)
    return {
        "obs": np.repeat((ids % 251)[:, None], 60, axis=1).astype(np.uint8),
        "reward": ids.astype(np.float32),
    }


@pytest.fixture
def chunks_of_64kb(monkeypatch):
    monkeypatch.setattr(store_changes, "CHECKPOINT_CHUNK_BYTES", 64 << 10)


def large_table(capacity: int = 64 * CHUNK_ROWS) -> Table:
    table = Table(
        "t",
        signature=SIG,
        capacity=capacity,
        max_size=capacity,
        sampler=Uniform(),
        remover=Fifo(),
        seed=0,
    )
    table.insert(rows(0, capacity))
    assert table.store.chunk_rows == CHUNK_ROWS
    return table


def column_files(path: Path) -> dict[str, list[Path]]:
    manifest = json.loads((path / "manifest.json").read_text())
    (store,) = manifest["stores"]
    return {p: [path / n for n in names] for p, names in store["columns"].items()}


def save(table: Table, root: Path, **kwargs) -> tuple[Path, SaveStats]:
    stats = SaveStats()
    path = checkpoint.save(table, root, stats=stats, **kwargs)
    return path, stats


def test_a_second_checkpoint_after_a_few_inserts_writes_only_the_changed_chunks(
    chunks_of_64kb, tmp_path
):
    table = large_table()
    first, full = save(table, tmp_path)
    assert full.reused_bytes == 0 and full.bytes == full.total_bytes
    table.insert(rows(10**6, 100))  # rows 0..99: the first chunk only
    second, stats = save(table, tmp_path)
    old, new = column_files(first), column_files(second)
    changed = {
        c
        for p in new
        for c, (a, b) in enumerate(zip(old[p], new[p]))
        if os.stat(a).st_ino != os.stat(b).st_ino
    }
    assert changed == {0}
    column_bytes = sum(f.stat().st_size for files in new.values() for f in files)
    written = sum(files[0].stat().st_size for files in new.values())
    assert stats.reused_bytes == column_bytes - written
    assert written < column_bytes / 50  # 1 chunk of 64
    assert stats.bytes == stats.total_bytes - stats.reused_bytes
    # the per-item arrays are written whole; the columns only where they changed
    assert stats.bytes < full.bytes - stats.reused_bytes + written
    restored = only_table(second)
    for p, col in table.store.columns.items():
        np.testing.assert_array_equal(restored.store.columns[p], col)


def test_keep_1_deletes_the_older_checkpoint_and_the_newer_still_restores(chunks_of_64kb, tmp_path):
    table = large_table(8 * CHUNK_ROWS)
    first, _ = save(table, tmp_path, keep=1)
    table.insert(rows(10**6, CHUNK_ROWS + 5))
    second, stats = save(table, tmp_path, keep=1)
    assert stats.reused_bytes > 0
    assert not first.exists() and checkpoint.list_checkpoints(tmp_path) == [second]
    restored = only_table(tmp_path, verify=True)
    for p, col in table.store.columns.items():
        np.testing.assert_array_equal(restored.store.columns[p], col)
    assert restored.sample(8).data["obs"].shape == (8, 60)


def test_unchanged_chunks_are_copied_where_links_cannot_be_made(
    chunks_of_64kb, tmp_path, monkeypatch
):
    table = large_table(8 * CHUNK_ROWS)
    save(table, tmp_path)
    table.insert(rows(10**6, 10))

    def no_links(src, dst, *args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(increments.os, "link", no_links)
    second, stats = save(table, tmp_path)
    assert stats.reused_bytes > 0
    new = column_files(second)
    assert all(f.stat().st_nlink == 1 for files in new.values() for f in files)
    restored = only_table(second, verify=True)
    for p, col in table.store.columns.items():
        np.testing.assert_array_equal(restored.store.columns[p], col)


def test_a_chunk_whose_previous_file_is_gone_is_written_again(chunks_of_64kb, tmp_path):
    table = large_table(8 * CHUNK_ROWS)
    first, _ = save(table, tmp_path)
    column_files(first)["obs"][3].unlink()  # as if pruned while this save began
    table.insert(rows(10**6, 10))
    second, _ = save(table, tmp_path)
    files = column_files(second)
    assert files["obs"][3].stat().st_nlink == 1 and files["reward"][3].stat().st_nlink == 1
    assert files["obs"][5].stat().st_nlink == 2
    restored = only_table(second, verify=True)
    for p, col in table.store.columns.items():
        np.testing.assert_array_equal(restored.store.columns[p], col)


def test_columns_replaced_by_a_restore_into_the_table_are_not_taken_for_unchanged(
    chunks_of_64kb, tmp_path
):
    """A restore into a table replaces its store's columns: its next save must not link
    the files its earlier checkpoint wrote of the columns it had then."""
    table = large_table(8 * CHUNK_ROWS)
    save(table, tmp_path / "mine")
    other = large_table(8 * CHUNK_ROWS)
    other.insert(rows(5 * 10**6, 8 * CHUNK_ROWS))  # other contents in every chunk
    save(other, tmp_path / "other")
    checkpoint.restore(tmp_path / "other", [table])
    path, stats = save(table, tmp_path / "mine")
    assert stats.reused_bytes == 0
    restored = only_table(path, verify=True)
    for p, col in other.store.columns.items():
        np.testing.assert_array_equal(restored.store.columns[p], col)


def test_a_memory_mapped_restore_maps_the_chunk_files_side_by_side(chunks_of_64kb, tmp_path):
    table = large_table(8 * CHUNK_ROWS)
    path, _ = save(table, tmp_path)
    mapped = only_table(path, mmap=True)
    col = mapped.store.columns["obs"]
    assert type(col.base).__name__ == "_Mapping"  # mapped, not read into memory
    for p, c in table.store.columns.items():
        np.testing.assert_array_equal(mapped.store.columns[p], c)
    before = column_files(path)["obs"][0].read_bytes()
    mapped.insert(rows(10**6, 10))  # copy-on-write: the files do not change
    assert column_files(path)["obs"][0].read_bytes() == before
    assert mapped.store.columns["reward"][:10].tolist() == list(range(10**6, 10**6 + 10))
    again, _ = save(mapped, tmp_path, keep=1)  # a mapped table saves (all written)
    del mapped, col
    np.testing.assert_array_equal(
        only_table(again).store.columns["reward"][:10], np.arange(10**6, 10**6 + 10)
    )


OPS = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, 2), st.integers(1, 9)),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("config", ["prioritized", "shared_store", "stack", "queue"])
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(before=OPS, between=OPS, after=OPS)
def test_two_saves_in_a_row_restore_every_call_as_the_saved_tables(config, before, between, after):
    """Operations, a save, more operations, a second save reusing the chunks they left
    unchanged (files of 4 rows), then the same calls on the tables and on a restore of
    the second: the same results, and the same columns."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_changes, "CHECKPOINT_CHUNK_ALIGN", 1)
        mp.setattr(store_changes, "CHECKPOINT_CHUNK_BYTES", 4 * 20)
        tables = CONFIGS[config]()
    memory: dict = {}
    run(tables, before, memory)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.save(tables, tmp)
        run(tables, between, memory)
        stats = SaveStats()
        checkpoint.save(tables, tmp, keep=1, stats=stats)
        restored = checkpoint.restore(tmp, verify=True)
        store = next(iter(tables.values())).store
        chunks = len(store.chunk_generations)
        assert chunks > 1
        for p, col in store.columns.items():
            np.testing.assert_array_equal(next(iter(restored.values())).store.columns[p], col)
        expected = run(tables, after, copy.deepcopy(memory))
        got = run(restored, after, copy.deepcopy(memory))
    assert got == expected


def test_a_format_version_1_checkpoint_one_file_per_column_still_restores(tmp_path):
    """Version 1 named one file per column (a string in ``columns``); it restores."""
    table = Table("t", signature=SIG, capacity=64, max_size=64, seed=0)
    table.insert(rows(0, 40))
    path = checkpoint.save(table, tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    (store,) = manifest["stores"]
    for field, (name,) in store["columns"].items():
        old = name.replace(".k000000", "")
        os.rename(path / name, path / old)
        manifest["files"][old] = manifest["files"].pop(name)
        store["columns"][field] = old
    del store["chunk_rows"], store["increments"]
    manifest["format_version"] = 1
    del manifest["manifest_crc32"]  # that version wrote none
    (path / "manifest.json").write_text(json.dumps(manifest))
    restored = only_table(path, verify=True)
    for p, col in table.store.columns.items():
        np.testing.assert_array_equal(restored.store.columns[p], col)
    mapped = only_table(path, mmap=True)
    np.testing.assert_array_equal(mapped.store.columns["reward"], table.store.columns["reward"])
    # a save after it (into the same directory) writes everything: nothing to link from
    _, stats = save(restored, tmp_path)
    assert stats.reused_bytes == 0


def test_a_restore_shows_progress_over_every_chunk_file(chunks_of_64kb, tmp_path, monkeypatch):
    from rlreplay.checkpoint import loading

    counted: list[int] = []

    class Recording:
        def __init__(self, enabled: bool, total: int, what: str):
            self.update = counted.append if enabled else None

        def close(self) -> None:
            pass

    monkeypatch.setattr(loading, "Progress", Recording)
    table = large_table(8 * CHUNK_ROWS)
    path, _ = save(table, tmp_path)
    only_table(path, progress=True)
    assert sum(counted) == table.store.nbytes  # every column byte, chunk after chunk
