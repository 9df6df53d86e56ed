"""A store's wakers: told after every change that may let a waiting call go on."""

from __future__ import annotations

import numpy as np
import pytest

import rlreplay as rr


def table() -> rr.Table:
    return rr.Table(
        "t", signature={"x": "float32"}, max_size=8, sampler=rr.Prioritized(1.0),
        remover=rr.Fifo(), rate_limiter=rr.MinSize(1),
    )


CHANGES = [
    ("insert", lambda t, keys: t.insert({"x": np.zeros(2, np.float32)}), True),
    ("sample", lambda t, keys: t.sample(1, timeout=1.0), True),
    ("delete", lambda t, keys: t.delete(keys[:1]), True),
    ("reset", lambda t, keys: t.reset(), True),
    ("update_priorities", lambda t, keys: t.update_priorities(keys, [2.0, 3.0]), False),
    ("info", lambda t, keys: t.info(), False),
]


@pytest.mark.parametrize(("change", "wakes"), [(c[1], c[2]) for c in CHANGES],
                         ids=[c[0] for c in CHANGES])
def test_a_waker_is_told_of_the_changes_that_may_let_a_waiting_call_go_on(change, wakes):
    t = table()
    keys = t.insert({"x": np.zeros(2, np.float32)})
    calls: list[int] = []

    def waker() -> None:
        calls.append(1)

    t.store.add_waker(waker)
    change(t, keys)
    assert bool(calls) == wakes
    t.store.remove_waker(waker)
    calls.clear()
    t.insert({"x": np.zeros(1, np.float32)})
    assert calls == []
    t.store.remove_waker(waker)  # one not added is ignored
