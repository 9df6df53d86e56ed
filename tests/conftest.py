"""Shared helpers for the core tests: small tables whose rows carry their own step id."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import settings

from rlreplay import Table

# Property tests draw the same examples on every run, so a run fails only where the code
# changed, never on a rare example met once; `pytest --hypothesis-profile=explore` draws
# fresh examples (and more of them) to look for new failures.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", max_examples=500)
settings.load_profile("repeatable")

ROW_SIGNATURE = {"step": "int64", "obs": ((3,), "float32")}


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    """``n`` rows whose ``step`` field is its id and ``obs`` repeats it (data to check)."""
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"step": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)}


def assert_rows_consistent(data: dict[str, np.ndarray]) -> None:
    """Every returned row's fields agree with each other (no torn or mixed rows)."""
    np.testing.assert_array_equal(data["obs"], np.repeat(data["step"][:, None], 3, axis=1))


@pytest.fixture
def make_table() -> Callable[..., Table]:
    """Factory of row tables over ``ROW_SIGNATURE`` (keyword arguments go to Table)."""
    tables: list[Table] = []

    def make(**kwargs) -> Table:
        kwargs.setdefault("signature", ROW_SIGNATURE)
        kwargs.setdefault("seed", 0)
        table = Table("t", **kwargs)
        tables.append(table)
        return table

    yield make
    for table in tables:
        table.close()


class Worker(threading.Thread):
    """A thread that runs ``fn`` once and keeps its result or exception for the test."""

    def __init__(self, fn: Callable[[], object]):
        super().__init__(daemon=True)
        self.fn = fn
        self.result: object = None
        self.error: BaseException | None = None
        self.started_waiting = threading.Event()

    def run(self) -> None:
        self.started_waiting.set()
        try:
            self.result = self.fn()
        except BaseException as exc:  # reported by the test that joins it
            self.error = exc

    def finish(self, timeout: float = 5.0) -> object:
        """Join within ``timeout`` seconds; re-raise the thread's error; return its result."""
        self.join(timeout)
        assert not self.is_alive(), "worker thread did not finish in time"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture(autouse=True)
def _examples_in_a_temporary_folder(request, tmp_path, monkeypatch):
    """The example tests run in a temporary folder: a run without ``--out`` writes its
    files to ``runs/<example>`` under the working directory, never into the checkout."""
    if request.node.path.parent.name == "examples":
        monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _sb3_log_folder(monkeypatch, tmp_path_factory):
    """SB3's logger makes a folder under the system's temporary directory at every
    ``learn()``: the tests give it one of their own, so that none is left behind."""
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path_factory.getbasetemp() / "sb3_log"))
