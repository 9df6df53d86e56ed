"""The example server configuration builds the tables it describes."""

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    tomllib = pytest.importorskip("tomli")

from rlreplay.net.config import tables_from_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tables.toml"


def test_example_tables_toml_builds_a_shared_store_and_a_queue():
    tables = {t.name: t for t in tables_from_config(tomllib.loads(EXAMPLE.read_text()))}
    assert set(tables) == {"replay", "rows"}
    assert tables["replay"].layout.span == 2 and tables["replay"].store.capacity == 100_000
    assert tables["rows"].max_times_sampled == 1
