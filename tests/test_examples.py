"""The example server configuration builds the tables it describes."""

from pathlib import Path

import pytest

pytest.importorskip("zmq")  # rlreplay.net needs the net extra

from rlreplay.net.server.config import load_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tables.toml"


def test_example_tables_toml_builds_a_shared_store_and_a_queue():
    tables = {t.name: t for t in load_config(EXAMPLE)}
    assert set(tables) == {"replay", "rows"}
    assert tables["replay"].layout.span == 2 and tables["replay"].store.capacity == 100_000
    assert tables["rows"].max_times_sampled == 1
