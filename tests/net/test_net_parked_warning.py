"""A call parked at a server by its rate limiter does not hang silently: it logs the
in-process blocked call's warning on the server's log after the table's ``warn_after``,
and its blocked time shows in ``info`` while it is still parked."""

from __future__ import annotations

import threading
import time

import numpy as np
from netprocs import CTX, START_TIMEOUT_S, config, serve_logging

from rlreplay.net import Client
from rlreplay.runtime.stop_flag import StopFlag

CONFIG = config(
    {
        "name": "t",
        "signature": {"x": "int64"},
        "max_size": 100,
        "warn_after": 0.3,
        # admits 3 inserts before a sample: a 4th is parked until one is taken
        "rate_limiter": {
            "type": "SampleToInsertRatio",
            "samples_per_insert": 1.0,
            "min_size_to_sample": 1,
            "error_buffer": 2.0,
        },
    }
)


def read(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_a_parked_insert_warns_once_on_the_server_log_and_counts_blocked_time(tmp_path):
    log_path = tmp_path / "server.log"
    out, stop = CTX.Queue(), StopFlag(CTX)
    proc = CTX.Process(
        target=serve_logging, args=(CONFIG, out, stop, {}, str(log_path)), daemon=True
    )
    proc.start()
    try:
        status, address = out.get(timeout=START_TIMEOUT_S)
        assert status == "ok", address
        writer, learner = Client(address), Client(address)
        try:
            writer.insert("t", {"x": np.arange(3)})
            parked: list = []
            inserting = threading.Thread(  # parked, without a timeout
                target=lambda: parked.append(writer.insert("t", {"x": np.int64(3)})),
                daemon=True,
            )
            inserting.start()
            deadline = time.monotonic() + 10.0
            while "has been blocked" not in read(log_path) and time.monotonic() < deadline:
                time.sleep(0.05)
            # still parked: the time it has waited already shows
            blocked = learner.info("t").insert_blocked_s
            assert learner.info("t").size == 3
            assert blocked >= 0.25, blocked
            warnings = [line for line in read(log_path).splitlines() if "blocked" in line]
            assert len(warnings) == 1, warnings
            assert warnings[0].startswith("WARNING parked insert on table 't' has been blocked")
            assert "samples_per_insert=1 ratio: the learner (sampler) is behind" in warnings[0]
            time.sleep(0.4)  # one warning per call, however long it stays parked
            lines = [line for line in read(log_path).splitlines() if "blocked" in line]
            assert lines == warnings
            learner.sample("t", 1, timeout=5.0)
            inserting.join(5.0)
            assert not inserting.is_alive() and len(parked[0]) == 1
            # the wait is counted once: what info showed plus the rest, not twice
            total = learner.info("t").insert_blocked_s
            assert blocked < total < blocked + 2.0, (blocked, total)
        finally:
            writer.close()
            learner.close()
    finally:
        stop.set()
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)
