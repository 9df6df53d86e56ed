"""A learner whose table is closed while the actors still run fails loudly, instead of
ending the run early and quietly; a table closed once the run is done or stopping ends
it as before."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import rlreplay
import rlreplay.runtime as rt
from rlreplay.errors import ClosedError
from rlreplay.runtime.learner import Learner
from rlreplay.runtime.weights import Weights


class Updates:
    def __init__(self) -> None:
        self.count = 0

    def update(self, batch):
        self.count += 1

    def params(self):
        return {"w": np.zeros(1, np.float32)}


def _learner() -> tuple[Learner, rlreplay.Table, Updates]:
    table = rlreplay.Table("replay", signature={"obs": "float32"}, max_size=1000)
    table.insert({"obs": np.zeros(500, np.float32)})
    config = rt.RuntimeConfig(batch_size=8, progress=False, timeout_s=10.0)
    logic = Updates()
    return Learner(logic, table, Weights(), config), table, logic


def _close_after(table: rlreplay.Table, logic: Updates, updates: int) -> threading.Thread:
    def close() -> None:
        end = time.monotonic() + 10.0
        while logic.count < updates and time.monotonic() < end:
            time.sleep(0.001)
        table.close()

    thread = threading.Thread(target=close)
    thread.start()
    return thread


def test_a_table_closed_while_the_actors_run_fails_the_learner():
    learner, table, logic = _learner()
    closer = _close_after(table, logic, 5)
    try:
        with pytest.raises(ClosedError, match="closed while the actors ran"):
            learner.run(done=lambda: False, stop=threading.Event(), max_updates=None)
    finally:
        closer.join(10.0)
    assert logic.count >= 5


def test_a_table_closed_once_the_actors_are_done_ends_the_learner_quietly():
    learner, table, logic = _learner()
    closer = _close_after(table, logic, 5)
    try:
        learner.run(done=lambda: logic.count >= 5, stop=threading.Event(), max_updates=None)
    finally:
        closer.join(10.0)
    assert logic.count >= 5
