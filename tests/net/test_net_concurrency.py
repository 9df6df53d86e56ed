"""Four writer processes and two sampler processes share one SampleToInsertRatio table."""

from __future__ import annotations

import time

import numpy as np
from netprocs import CTX, STEP_SIGNATURE, config, run_sampler, run_writer, served

import rlreplay
from rlreplay.runtime.stop_flag import StopFlag

WRITERS, SAMPLERS = 4, 2
STEPS, EPISODE = 600, 37
SPI, MIN_SIZE, ERROR_BUFFER = 2.0, 50, 60.0

CONFIG = config(
    {
        "name": "ratio",
        "signature": STEP_SIGNATURE,
        "capacity": 20000,
        "max_size": 20000,
        "layout": {"type": "transition", "n_step": 1, "next_fields": ["obs"]},
        "rate_limiter": {
            "type": "SampleToInsertRatio",
            "samples_per_insert": SPI,
            "min_size_to_sample": MIN_SIZE,
            "error_buffer": ERROR_BUFFER,
        },
    }
)


def test_writers_and_samplers_keep_the_ratio_and_every_acknowledged_item():
    with served(CONFIG) as (address, _):
        client = rlreplay.Client(address)
        out, stop = CTX.Queue(), StopFlag(CTX)
        writers = [
            CTX.Process(target=run_writer, args=(address, "ratio", w, STEPS, EPISODE, out))
            for w in range(WRITERS)
        ]
        samplers = [
            CTX.Process(target=run_sampler, args=(address, "ratio", stop, out, 16))
            for _ in range(SAMPLERS)
        ]
        procs = writers + samplers
        for p in procs:
            p.start()
        try:
            diffs = []
            results = []
            deadline = time.monotonic() + 120.0
            while len(results) < WRITERS and time.monotonic() < deadline:
                info = client.info("ratio")
                diffs.append(info.inserts * SPI - info.samples)
                while not out.empty():
                    results.append(out.get())
                time.sleep(0.05)
            stop.set()
            while len(results) < WRITERS + SAMPLERS and time.monotonic() < deadline:
                results.append(out.get(timeout=max(0.1, deadline - time.monotonic())))
        finally:
            stop.set()
            for p in procs:
                p.join(20.0)
                if p.is_alive():
                    p.kill()
        errors = [r for r in results if r[0] != "ok"]
        assert not errors, errors
        assert len(results) == WRITERS + SAMPLERS, "a process did not finish (deadlock?)"

        written = [r for r in results if len(r) == 3]
        keys = np.concatenate([np.array(r[2], np.int64) for r in written])
        per_episode = EPISODE - 1
        expected = WRITERS * (STEPS // EPISODE * per_episode + max(0, STEPS % EPISODE - 1))
        assert len(keys) == expected
        # All acknowledged items are held: an update reaches each of them exactly once.
        assert client.update_priorities("ratio", keys, np.ones(len(keys))) == expected
        info = client.info("ratio")
        assert info.size == info.inserts == expected

        sampled = [r for r in results if len(r) == 4]
        assert sum(r[3] for r in sampled) == 0, "a sampled item had torn or mixed steps"
        assert sum(r[2] for r in sampled) == info.samples > 0
        lim = info.rate_limiter
        diffs.append(info.inserts * SPI - info.samples)
        assert min(diffs) >= min(lim["min_diff"], 0.0) - 1e-9
        assert max(diffs) <= lim["max_diff"] + 1e-9
        # After the writers finish, samplers drain to the lower edge of the buffer.
        assert lim["min_diff"] - 1e-9 <= diffs[-1] <= lim["min_diff"] + 16 + 1e-9
