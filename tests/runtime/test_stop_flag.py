"""StopFlag: processes killed at any moment while they poll, wait on or set the flag never
leave it unusable for the others (the way a killed process wedges multiprocessing.Event)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

from rlreplay.runtime.stop_flag import StopFlag

CTX = mp.get_context("spawn")


def poll_forever(flag: StopFlag, how: str) -> None:
    deadline = time.monotonic() + 60.0  # bounded even if nobody kills it
    while time.monotonic() < deadline:
        if how == "is_set":
            flag.is_set()
        elif how == "wait":
            flag.wait(0.001)
        else:
            flag.set()


def finishes_within(call, limit_s: float = 5.0) -> bool:
    done = threading.Event()
    threading.Thread(target=lambda: (call(), done.set()), daemon=True).start()
    return done.wait(limit_s)


def test_processes_killed_while_using_the_flag_never_wedge_it():
    flag = StopFlag(CTX)
    children = [
        CTX.Process(target=poll_forever, args=(flag, how), daemon=True)
        for how in ("is_set", "wait", "set", "is_set", "wait")
    ]
    for child in children:
        child.start()
    time.sleep(1.0)  # every child is inside its loop by now (spawn starts in < 1 s here)
    for child in children:
        os.kill(child.pid, signal.SIGKILL)
        child.join(5.0)
        assert child.exitcode == -signal.SIGKILL
    assert finishes_within(flag.set)
    assert finishes_within(lambda: flag.wait(None))
    assert flag.is_set()


def test_wait_times_out_unset_and_returns_at_once_when_set():
    flag = StopFlag(CTX)
    start = time.monotonic()
    assert flag.wait(0.05) is False
    assert 0.04 <= time.monotonic() - start < 2.0
    assert flag.wait(0) is False and not flag.is_set()
    flag.set()
    assert flag.wait(0) is True and flag.wait(None) is True


def test_a_child_sees_the_parent_set_the_flag():
    flag, out = StopFlag(CTX), CTX.Queue()
    child = CTX.Process(target=_report_when_set, args=(flag, out), daemon=True)
    child.start()
    try:
        flag.set()
        assert out.get(timeout=30.0) is True
    finally:
        child.join(10.0)
        if child.is_alive():
            child.kill()


def _report_when_set(flag: StopFlag, out) -> None:
    out.put(flag.wait(30.0))
