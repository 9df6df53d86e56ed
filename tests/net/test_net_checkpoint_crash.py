"""Crash safety with real processes and SIGKILL: a server killed while clients insert and
sample and it checkpoints leaves a newest checkpoint that loads, is consistent and holds
everything acknowledged before its moment; writers killed mid-episode and mid-chunk
leave no partial item, and the server keeps serving. (``python -m
benchmarks.crash_trials`` runs the server trials 50 times.)"""

from __future__ import annotations

import random
import time

from checkpoint_procs import (
    CTX,
    check_checkpoint,
    config,
    kill,
    sample_until,
    server_process,
    write_steps,
)
from netprocs import free_port

import rlreplay
from benchmarks import crash_trials
from rlreplay.runtime.stop_flag import StopFlag


def test_server_killed_at_random_moments_leaves_a_valid_complete_newest_checkpoint(tmp_path):
    # killed after the first periodic checkpoint (every 0.1 to 0.5 s) had time to publish
    rows = crash_trials.run_trials(3, seed=11, store_mib=8.0, root=tmp_path, kill_range=(1, 2))
    for row in rows:
        assert not crash_trials.failed(row), row
    checked = [r for r in rows if "items" in r]
    assert checked, rows  # at least one trial had a checkpoint when the server died
    for row in checked:
        assert row["acked_before"] > 0 and row["restart"]["restored"] == row["path"]


def test_writers_killed_mid_episode_leave_no_partial_item_and_the_server_keeps_serving(tmp_path):
    rng = random.Random(0)
    out, stop = CTX.Queue(), StopFlag(CTX)
    with server_process(config(), free_port(), checkpoint_dir=str(tmp_path)) as (_, address, _):
        sampler = CTX.Process(target=sample_until, args=(address, stop, out, 60.0), daemon=True)
        doomed = [
            CTX.Process(
                target=write_steps, args=(address, w, 10**6, out, 60.0, None, 0.001), daemon=True
            )
            for w in (1, 2, 3)
        ]
        survivor = CTX.Process(
            target=write_steps, args=(address, 9, 1500, out, 60.0, None, 0.002), daemon=True
        )
        client = rlreplay.Client(address, call_timeout=5.0)
        try:
            for p in (sampler, *doomed, survivor):
                p.start()
            for p in doomed:  # each killed at its own moment: mid-episode, often mid-chunk
                deadline = time.monotonic() + 30.0
                while client.info("seq").size < 50 and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.05, 0.6))
                kill(p)
            got = [out.get(timeout=60.0)]  # the survivor's, unless the sampler failed
            stop.set()
            got.append(out.get(timeout=30.0))
            result = next(r for r in got if len(r) == 6)  # a writer's report has 6 fields
            sampled = next(r for r in got if len(r) == 5)
            path = client.checkpoint(timeout=30.0)
        finally:
            stop.set()
            for p in (sampler, *doomed, survivor):
                kill(p)
            client.close()
    assert result[0] == "ok" and result[1] == 9, result
    assert result[2][-1][1] > 0 and result[5] == 0  # every chunk of the survivor stored
    status, n_sampled, bad, errors, _ = sampled
    assert status == "ok" and n_sampled > 0 and bad == 0 and not errors
    report = check_checkpoint(path, {9: result[2]})
    assert report["bad"] == 0 and report["duplicates"] == 0 and report["missing"] == 0
    assert report["acked_before"] == result[2][-1][1]  # all of the survivor's items
