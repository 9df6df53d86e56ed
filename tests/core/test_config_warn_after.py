"""Server configuration entries: a [[table]] sets its table's ``warn_after``; [[store]]
names are unique."""

from __future__ import annotations

import pytest

from rlreplay.core import waiting
from rlreplay.errors import InvalidArgumentError
from rlreplay.net.server.config import tables_from_config

SIG = {"x": "float32"}


def build(**entry):
    return tables_from_config({"table": [{"name": "t", "signature": SIG, **entry}]})[0]


def test_warn_after_reaches_tables_and_queues():
    assert build(max_size=4, warn_after=2.5).warn_after == 2.5
    assert build(kind="queue", size=3, warn_after=1).warn_after == 1.0
    assert build(max_size=4).warn_after == waiting.WARN_AFTER_S


def test_warn_after_false_turns_the_warning_off():
    assert build(max_size=4, warn_after=False).warn_after is None
    assert build(kind="stack", size=3, warn_after=False).warn_after is None


@pytest.mark.parametrize("value", [0, -1, True, "5s"])
def test_a_bad_warn_after_names_the_entry_and_the_value(value):
    with pytest.raises(InvalidArgumentError, match=r"table\[0\] 't': warn_after=") as err:
        build(max_size=4, warn_after=value)
    assert "false in a config file" in str(err.value)


def test_a_repeated_store_name_is_refused_before_its_store_is_built(monkeypatch):
    from rlreplay.net.server import config as config_module

    built = []
    real = config_module.StepStore
    monkeypatch.setattr(
        config_module, "StepStore", lambda *a, **k: built.append(a) or real(*a, **k)
    )
    store = {"name": "s", "capacity": 8, "signature": {"x": "float32"}}
    config = {"store": [store, dict(store)], "table": [{"name": "t", "store": "s"}]}
    with pytest.raises(InvalidArgumentError, match=r"store\[1\].*another \[\[store\]\]"):
        tables_from_config(config)
    assert len(built) == 1
