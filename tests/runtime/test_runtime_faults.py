"""A failing part stops the run and is named; nothing is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("gymnasium")

import parts

import rlreplay.runtime as rt
from rlreplay.errors import ComponentFailedError


def run(backend: str, policy=parts.RandomPolicy, learner=None, total=20_000, **kwargs):
    kwargs.setdefault("num_actors", 2)
    config = rt.RuntimeConfig(
        backend=backend, updates_per_env_step=0.25, batch_size=16, min_size_to_sample=200,
        weight_sync_period=50, progress=False, timeout_s=20.0, **kwargs,
    )
    return rt.run(
        config, make_env=parts.make_env, make_policy=policy,
        learner=learner or parts.CountingLearner(), replay=parts.replay(),
        total_env_steps=total,
    )


@pytest.mark.parametrize("backend", ["inline", "threads", "processes"])
def test_an_actor_that_raises_fails_the_run_naming_it(backend):
    start = time.monotonic()
    with pytest.raises(ComponentFailedError, match="policy exploded") as info:
        run(backend, policy=parts.CrashingPolicy)
    assert info.value.component.startswith("actor ")
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("backend", ["inline", "threads", "processes"])
def test_a_learner_that_raises_fails_the_run_naming_it(backend):
    with pytest.raises(ComponentFailedError, match="loss is nan") as info:
        run(backend, learner=parts.CountingLearner(fail_at=20))
    assert info.value.component == "learner"
    assert isinstance(info.value.__cause__, ValueError)


def test_actor_threads_stuck_in_calls_are_waited_for_once_not_each_in_turn():
    """The driver gives stopping actors 5 s in all: three actor threads stuck in a 30 s
    call cost it those 5 s once (they are daemon threads: the run does not wait longer)."""
    start = time.monotonic()
    with pytest.raises(ComponentFailedError, match="policy exploded"):
        run("threads", policy=parts.StuckOrCrashingPolicy, num_actors=4)
    assert time.monotonic() - start < 12  # 15 s and more when each got 5 s


def test_an_actor_process_killed_fails_the_run_within_5_s():
    start = time.monotonic()
    with pytest.raises(ComponentFailedError, match="signal 9") as info:
        run("processes", policy=parts.DyingPolicy, total=400_000)
    assert info.value.component == "actor 0"
    assert time.monotonic() - start < 60  # process start-up included; detection is < 5 s


def test_processes_backend_takes_every_step_through_the_server():
    learner = parts.CountingLearner()
    result = run("processes", learner=learner, total=4_000)
    assert result.summary["env_steps"] == 4_000
    assert learner.updates > 0
    assert result.summary["weight_version"] >= 1


def test_processes_backend_refuses_parts_it_cannot_pickle():
    with pytest.raises(rt.ComponentFailedError.__mro__[1], match="pickled"):
        rt.run(
            rt.RuntimeConfig(backend="processes", updates_per_env_step=0.25, progress=False),
            make_env=lambda seed: parts.make_env(seed), make_policy=parts.RandomPolicy,
            learner=parts.CountingLearner(), replay=parts.replay(), total_env_steps=100,
        )


FROM_STDIN = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import parts
    import rlreplay.runtime as rt

    def make_env(seed):  # in __main__, which an actor process cannot import from stdin
        return parts.make_env(seed)

    rt.run(
        rt.RuntimeConfig(backend="processes", updates_per_env_step=0.25, batch_size=16,
                         min_size_to_sample=200, progress=False, timeout_s=20.0),
        make_env=make_env, make_policy=parts.RandomPolicy, learner=parts.CountingLearner(),
        replay=parts.replay(), total_env_steps=1_000,
    )
    """
)


def test_actor_processes_that_cannot_load_main_say_why():
    tests = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(
        [sys.executable, "-"], input=FROM_STDIN.format(tests=tests), capture_output=True,
        text=True, timeout=120, cwd=tests,
    )
    last = done.stderr.strip().splitlines()[-1]
    assert "ComponentFailedError: actor 0 failed" in last, last
    assert 'if __name__ == "__main__":' in last and "read from stdin" in last


CTRL_C = textwrap.dedent(
    """
    import signal, sys
    # Ctrl-C as a terminal delivers it to a program in the foreground, also where the suite
    # itself runs as a background job (which starts with SIGINT ignored, inherited here).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    import parts, rlreplay.runtime as rt
    config = rt.RuntimeConfig(backend={backend!r}, num_actors=2, updates_per_env_step=0.25,
                              batch_size=16, min_size_to_sample=200, progress=False)
    print("started", flush=True)
    rt.run(config, make_env=parts.make_env, make_policy=parts.RandomPolicy,
           learner=parts.CountingLearner(delay_s=0.002), replay=parts.replay(),
           total_env_steps=10_000_000)
    """
)


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read().lower()
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_ctrl_c_stops_every_thread_and_process(backend):
    here = os.path.dirname(__file__)
    code = CTRL_C.format(tests=here, backend=backend)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        time.sleep(4.0)  # actors (processes: spawned) are running
        children = _children(proc.pid)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        assert proc.returncode != 0  # KeyboardInterrupt propagated
        time.sleep(0.5)
        alive = [c for c in children if _running(c)]
        assert not alive, f"left running: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
