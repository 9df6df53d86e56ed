"""A damaged checkpoint file is a CheckpointCorruptError naming it, never numpy's own
error: bytes flipped in the header or data of every kind of array file (a store's column
chunk, the item index's arrays, the sampler's trees and sets) and files cut short, read
into memory, memory-mapped with checksums, and memory-mapped without them (where only
the header can be checked). A bounded, deterministic fuzz: a few hundred restores.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from checkpoint_ops import only_table

from rlreplay import CheckpointCorruptError, Prioritized, Table, Uniform, checkpoint

SIG = {"step": "int64", "obs": ((3,), "float32")}


def _tables() -> list[Table]:
    prioritized = Table("p", signature=SIG, max_size=32, sampler=Prioritized(0.5), seed=3)
    ids = np.arange(20, dtype=np.int64)
    prioritized.insert(
        {"step": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)},
        np.linspace(0.1, 2.0, 20),
    )
    prioritized.sample(4)
    uniform = Table("u", signature=SIG, max_size=16, sampler=Uniform(), seed=4)
    uniform.insert({"step": ids[:10], "obs": np.ones((10, 3), np.float32)})
    return [prioritized, uniform]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """One checkpoint per table kind: table name -> its checkpoint directory."""
    root = tmp_path_factory.mktemp("saved")
    return {t.name: checkpoint.save(t, root / t.name) for t in _tables()}


def _contents(table: Table) -> list[np.ndarray]:
    """What a restore must give back exactly: the store's steps and every item's state."""
    index = table.index
    parts = [np.asarray(col) for col in table.store.columns.values()]
    parts += [np.asarray(index.generation), np.asarray(index.live), np.asarray(index.priority)]
    return [*parts, np.asarray(index.times_sampled)]


def _header_bytes(path: Path) -> int:
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        return f.tell()


def _damages(path: Path, rng: random.Random) -> dict[str, tuple[str, int, int]]:
    """Named damages of one array file: (kind, byte position, xor mask or cut length)."""
    size, header = path.stat().st_size, _header_bytes(path)
    out = {}
    # every byte of the magic, version and length; a sample of the header's text
    positions = list(range(10)) + rng.sample(range(10, header), min(6, header - 10))
    for at in positions:
        out[f"header byte {at} flipped"] = ("flip", at, 1 << rng.randrange(8))
    for at in rng.sample(range(header, size), min(3, size - header)):
        out[f"data byte {at} flipped"] = ("flip", at, 1 << rng.randrange(8))
    for cut in sorted({0, 9, header // 2, header, size - 1}):
        out[f"cut to {cut} bytes"] = ("cut", cut, 0)
    return out


def _damage(path: Path, kind: str, at: int, arg: int) -> None:
    data = bytearray(path.read_bytes())
    if kind == "flip":
        data[at] ^= arg
    else:
        del data[at:]
    path.write_bytes(bytes(data))


CASES = [
    (table, name, damage)
    for table in ("p", "u")
    for name in ("column", "index", "sampler")
    for damage in ("header", "data", "cut")
]
READS = {
    "read": {"mmap": False},
    "mapped_and_verified": {"mmap": True, "verify": True},
    "mapped_unverified": {"mmap": True, "verify": False},
}


def _files_of_kind(directory: Path, kind: str) -> list[Path]:
    names = sorted(p.name for p in directory.glob("*.npy"))
    if kind == "column":
        picked = [n for n in names if n.startswith("s")]
    elif kind == "index":
        picked = [n for n in names if ".index." in n and ".sampler." not in n]
    else:
        picked = [n for n in names if ".sampler." in n]
    assert picked, (kind, names)
    return [directory / n for n in picked]  # one of them is damaged, drawn by name


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("table, kind, damage", CASES)
def test_every_damaged_array_file_is_a_corrupt_error_naming_it(
    saved, tmp_path, table, kind, damage, read
):
    original = _contents(only_table(saved[table]))
    rng = random.Random(f"{table}{kind}{damage}")
    for source in rng.sample(_files_of_kind(saved[table], kind), 1):
        cases = {n: d for n, d in _damages(source, rng).items() if n.split()[0] == damage}
        for case, (how, at, arg) in cases.items():
            copy = tmp_path / f"{source.stem}-{how}-{at}"
            shutil.copytree(saved[table], copy)
            _damage(copy / source.name, how, at, arg)
            try:
                restored = only_table(copy, **READS[read])
            except CheckpointCorruptError as exc:
                assert source.name in str(exc), (case, str(exc))
                continue
            # Only a memory-mapped restore without checksums may miss a damage, and only
            # in the data (which it serves as it is on disk); a header it reads is checked.
            assert read == "mapped_unverified", f"{source.name}: {case} was not detected"
            if damage == "header":
                got = _contents(restored)
                assert all(np.array_equal(a, b) for a, b in zip(got, original)), case
            else:
                assert damage == "data", case


MANIFEST_CUTS = {"to_nothing": 0.0, "in_half": 0.5, "but_its_last_byte": -1}


@pytest.mark.parametrize("cut", MANIFEST_CUTS)
def test_a_manifest_cut_short_is_a_corrupt_error_naming_it(saved, tmp_path, cut):
    copy = tmp_path / "c"
    shutil.copytree(saved["p"], copy)
    path = copy / "manifest.json"
    data = path.read_bytes()
    where = MANIFEST_CUTS[cut]
    path.write_bytes(data[: int(where * len(data)) if where >= 0 else len(data) - 1])
    with pytest.raises(CheckpointCorruptError, match=r"manifest\.json"):
        only_table(copy)


def test_a_flipped_byte_anywhere_in_the_manifest_is_caught_by_its_checksum(saved, tmp_path):
    """The manifest carries its own crc32: a flip in a number (a size, a step count, a
    priority exponent) is refused, never restored as a different table. Only a flip in
    the checksum entry's own name leaves what restore reads whole."""
    original = _contents(only_table(saved["p"]))
    data = (saved["p"] / "manifest.json").read_bytes()
    rng = random.Random(5)
    for at in sorted(rng.sample(range(len(data)), 60)):
        copy = tmp_path / f"m{at}"
        shutil.copytree(saved["p"], copy)
        flipped = bytearray(data)
        flipped[at] ^= 1 << rng.randrange(8)
        (copy / "manifest.json").write_bytes(bytes(flipped))
        try:
            restored = only_table(copy)
        except CheckpointCorruptError as exc:
            assert "manifest.json" in str(exc), (at, str(exc))
            continue
        key = data.rfind(b'"manifest_crc32"')
        assert key <= at < key + len(b'"manifest_crc32"'), f"byte {at} flipped, not detected"
        got = _contents(restored)
        assert all(np.array_equal(a, b) for a, b in zip(got, original)), at
