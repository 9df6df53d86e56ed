"""``bench_checkpoint --server``: the longest call a server's clients see while it
checkpoints a table of many small items, before and after the step-wise capture.

A server process holds one ``Prioritized(0.6)`` table of ``--items`` one-float rows
(16,519,104 by default: the item count of 4 GB of 260-byte rows; the per-item state
the capture copies grows with the items, not the bytes). Two client threads of this
process call it: an actor inserting one row per call, waiting for each
acknowledgement, and a learner sampling 32 and updating their priorities. The main
thread asks for checkpoints (``client.checkpoint()``), alternating two ways of taking
the capture in the same server:

* ``stepwise`` (the server as shipped): the dispatcher takes the capture a step at a
  time between requests (:mod:`rlreplay.net.server.checkpoints`);
* ``one_turn`` (as before the change): the dispatcher takes every step at once, waiting
  for the capture's buffers too, so requests wait for the whole capture.

Figures per way (the worst over its rounds): ``longest_call_ms``, the longest call of
either thread that overlapped the checkpoint (asked until published; ``in_capture_ms``
of those that overlapped its capture, from its start to its moment, ``in_stream_ms``
of those that overlapped the streaming of its columns after the moment), next to
``baseline_ms``, the longest in the same load without one; ``capture_turn_ms``, the
longest the capture held the dispatcher at once (the server's ``longest_capture_s``);
``capture_s``, from the capture's start to its moment; ``calls_during``, calls answered
during the checkpoint.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

CTX = mp.get_context("spawn")
WAYS = ("stepwise", "one_turn")


def join_buffers(capture: Any) -> bool:
    """``Capture.waiting`` of the one-turn way: wait for the buffers' thread (as the
    dispatcher waited for a save's capture before the change), then never wait."""
    if capture._maker is not None:
        capture._maker.join()
    return False


def serve(items: int, directory: str, commands: Any, out: Any) -> None:
    """Child: build the table, serve it; on each command set the capture's way and
    report the server's checkpoint figures; stop on ``None``."""
    from rlreplay import Prioritized, Server, Table
    from rlreplay.checkpoint import snapshot
    from rlreplay.net.server import checkpoints

    table = Table("replay", signature={"x": "float32"}, max_size=items + 2_000_000,
                  sampler=Prioritized(0.6), seed=0)  # fmt: skip
    batch = 1 << 20
    for first in range(0, items, batch):
        n = min(batch, items - first)
        table.insert({"x": np.zeros(n, np.float32)}, np.random.default_rng(first).random(n) + 0.1)
    server = Server([table], checkpoint_dir=directory).start()
    out.put(server.address)
    stepwise = (checkpoints.STEP_S, snapshot.Capture.waiting)
    while True:
        way = commands.get(timeout=300)
        if way is None:
            break
        c = server.checkpoints
        c.longest_capture_s = 0.0
        if way == "stepwise":
            checkpoints.STEP_S, snapshot.Capture.waiting = stepwise
        else:  # every step in one dispatcher turn, the buffers' thread waited for
            checkpoints.STEP_S = float("inf")
            snapshot.Capture.waiting = property(join_buffers)
        out.put("set")
        commands.get(timeout=300)  # the checkpoint was published
        out.put({"capture_turn_s": c.longest_capture_s, "began": c.capture_began_unix,
                 "steps": c.capture_steps})  # fmt: skip
    server.stop()


class Load:
    """The actor and learner threads; each call's ``(sent, answered)`` in ``time.time()``."""

    def __init__(self, address: str):
        self.address, self.stop = address, threading.Event()
        self.calls: list[tuple[float, float]] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._act, self._learn)]

    def _act(self) -> None:
        self._timed_loop(lambda c: c.insert("replay", {"x": np.float32(1)}, 1.0), 0.0002)

    def _learn(self) -> None:
        prios = np.full(32, 0.5)

        def cycle(client) -> None:
            s = client.sample("replay", 32, timeout=10.0)
            client.update_priorities("replay", s.info.keys, prios)

        self._timed_loop(cycle, 0.001)

    def _timed_loop(self, call, pause_s: float) -> None:
        """``call(client)`` until stopped, each call's start and end kept, ``pause_s``
        apart; an error ends the loop and is kept."""
        import rlreplay

        client = rlreplay.Client(self.address, call_timeout=30.0)
        try:
            while not self.stop.is_set():
                t0 = time.time()
                call(client)
                self.calls.append((t0, time.time()))
                time.sleep(pause_s)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            client.close()

    def worst(self, t0: float, t1: float) -> tuple[float, int]:
        """Longest call (ms) overlapping ``[t0, t1]`` and how many there were."""
        d = [b - a for a, b in list(self.calls) if a <= t1 and b >= t0]
        return (1e3 * max(d), len(d)) if d else (0.0, 0)


def run(items: int, rounds: int, baseline_s: float, directory: str | None) -> dict[str, Any]:
    """Build the server, then ``rounds`` checkpoints per way, alternating."""
    import rlreplay
    from rlreplay.checkpoint.restore import load as load_checkpoint

    root = Path(tempfile.mkdtemp(prefix="bench-ckpt-server-", dir=directory))
    commands, out = CTX.Queue(), CTX.Queue()
    proc = CTX.Process(target=serve, args=(items, str(root), commands, out), daemon=True)
    t_build = time.perf_counter()
    proc.start()
    result: dict[str, Any] = {"items": items, "ways": {w: [] for w in WAYS}}
    try:
        address = out.get(timeout=600)
        result["build_s"] = time.perf_counter() - t_build
        client = rlreplay.Client(address, call_timeout=120.0)
        load = Load(address)
        for t in load.threads:
            t.start()
        time.sleep(0.3)
        t0 = time.time()
        time.sleep(baseline_s)
        result["baseline_ms"], _ = load.worst(t0, time.time())
        for r in range(rounds):
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                commands.put(way)
                assert out.get(timeout=60) == "set"
                t0 = time.time()
                path = client.checkpoint(timeout=300)
                t1 = time.time()
                commands.put("done")
                figures = out.get(timeout=60)
                moment = load_checkpoint(Path(path), False, None, False).manifest["created_unix"]
                worst, n = load.worst(t0, t1)
                result["ways"][way].append({
                    "longest_call_ms": worst,
                    "in_capture_ms": load.worst(figures["began"], moment)[0],
                    "in_stream_ms": load.worst(moment, t1)[0],
                    "calls_during": n,
                    "capture_turn_ms": 1e3 * figures["capture_turn_s"],
                    "capture_s": moment - figures["began"],
                    "checkpoint_s": t1 - t0,
                })  # fmt: skip
                time.sleep(0.3)
        load.stop.set()
        for t in load.threads:
            t.join(30)
        if load.errors:
            raise RuntimeError(f"a client call failed: {load.errors[0]!r}")
        client.close()
        commands.put(None)
        proc.join(30)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
        shutil.rmtree(root, ignore_errors=True)
    result["load_average"] = os.getloadavg()[0]
    return result


def report(result: dict[str, Any]) -> None:
    print(f"server checkpoint of {result['items']:,} items (build {result['build_s']:.1f} s; "
          f"load average {result['load_average']:.1f}); longest call without a checkpoint "
          f"{result['baseline_ms']:.1f} ms")  # fmt: skip
    keys = ("longest_call_ms", "in_capture_ms", "in_stream_ms", "capture_turn_ms", "capture_s",
            "checkpoint_s", "calls_during")  # fmt: skip
    print(f"{'way':<10}" + "".join(f"{k:>16}" for k in keys))
    for way, rows in result["ways"].items():
        for row in rows:
            print(f"{way:<10}" + "".join(f"{row[k]:>16.3f}" for k in keys))
