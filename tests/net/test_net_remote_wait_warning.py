"""A remote call held by a rate limiter warns in its caller's process, as a local table's
blocked call does: after the table's ``warn_after`` the server sends the call's client the
warning it logs (the table, its limiter's state and the likely cause), and the client's
process logs it while it waits. Every parked chunk of a writer names the cause that holds
it, also one that waits behind the writer's earlier chunk."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from netprocs import CTX, START_TIMEOUT_S, config, serve_logging

from rlreplay.errors import ReplayTimeoutError
from rlreplay.net import Client
from rlreplay.runtime.stop_flag import StopFlag

WARN_AFTER = 0.3
CONFIG = config(
    {
        "name": "t",
        "signature": {"x": "int64"},
        "max_size": 100,
        "warn_after": WARN_AFTER,
        # admits 3 inserts before a sample (no learner here): the 4th chunk is parked
        "rate_limiter": {
            "type": "SampleToInsertRatio",
            "samples_per_insert": 1.0,
            "min_size_to_sample": 1,
            "error_buffer": 2.0,
        },
    }
)
CAUSE = "samples_per_insert=1 ratio: the learner (sampler) is behind"


@pytest.fixture
def server_with_log(tmp_path):
    log_path = tmp_path / "server.log"
    out, stop = CTX.Queue(), StopFlag(CTX)
    proc = CTX.Process(
        target=serve_logging, args=(CONFIG, out, stop, {}, str(log_path)), daemon=True
    )
    proc.start()
    try:
        status, address = out.get(timeout=START_TIMEOUT_S)
        assert status == "ok", address
        yield address, log_path
    finally:
        stop.set()
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)


def test_a_remote_writer_held_by_the_limiter_warns_in_its_own_process(server_with_log, caplog):
    address, log_path = server_with_log
    client = Client(address)
    writer = client.trajectory_writer("t", chunk_steps=2, max_in_flight=2)
    caplog.set_level(logging.WARNING, logger="rlreplay")
    # chunks of 2 items: the 1st is stored, the 2nd parked (4 > 3 admitted), the 3rd
    # parked behind it (the limiter would admit 1 more item, but not the 2nd chunk's 2)
    for x in range(6):
        writer.append({"x": np.int64(x)})
        writer.create_item("t")
    start = time.time()
    with pytest.raises(ReplayTimeoutError):
        writer.flush(timeout=1.5)
    ended = time.time()
    ours = [r for r in caplog.records if "has been blocked for over" in r.getMessage()]
    assert ours, "the caller's process logged no warning while its writer waited"
    for record in ours:
        text = record.getMessage()
        assert text.startswith(f"insert on table 't' has been blocked for over {WARN_AFTER:g}s")
        assert CAUSE in text and "parked on the replay server" in text
        assert start <= record.created < ended  # while the caller waited, not after
    # the server's log names the cause of every parked chunk, the later one's too
    warnings = [ln for ln in log_path.read_text().splitlines() if "blocked for over" in ln]
    assert len(warnings) == 2, warnings
    for line in warnings:
        assert CAUSE in line and "queue table" not in line, line
    assert "waits behind it" in warnings[1]
    client.transport.close()  # the writer's chunks stay parked: do not wait for them


def test_a_remote_sample_held_by_the_limiter_warns_in_its_own_process(server_with_log, caplog):
    address, _ = server_with_log
    client = Client(address)
    caplog.set_level(logging.WARNING, logger="rlreplay")
    with pytest.raises(ReplayTimeoutError):
        client.sample("t", 1, timeout=0.8)  # nothing inserted
    (record,) = [r for r in caplog.records if "has been blocked for over" in r.getMessage()]
    assert record.getMessage().startswith("sample on table 't' has been blocked for over")
    assert "no writer is inserting" in record.getMessage()
    client.close()
