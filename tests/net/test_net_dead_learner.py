"""A learner killed (kill -9) while its ``sample`` waits on a queue table is never handed
an item: the server does not serve a parked call whose client's connection is gone, so
the items inserted next go to the learners that are alive."""

from __future__ import annotations

import time

import numpy as np
from netprocs import CTX, STEP_SIGNATURE, config, parked_queue_sample, served

import rlreplay

QUEUE = config({"name": "q", "kind": "queue", "size": 100, "signature": STEP_SIGNATURE})
LEARNERS = 4


def test_items_inserted_after_learners_were_killed_go_to_a_live_learner():
    with served(QUEUE) as (address, _):
        out = CTX.Queue()
        learners = [
            CTX.Process(target=parked_queue_sample, args=(address, "q", out), daemon=True)
            for _ in range(LEARNERS)
        ]
        try:
            for proc in learners:
                proc.start()
            for _ in learners:
                assert out.get(timeout=30.0)[0] == "connected"
            time.sleep(0.3)  # their sample requests reach the server and park
            for proc in learners:
                proc.kill()
            for proc in learners:
                proc.join(10.0)
                assert proc.exitcode is not None
            client = rlreplay.Client(address)
            steps = np.arange(LEARNERS)
            client.insert("q", {"obs": np.zeros((LEARNERS, 3), np.float32), "step": steps})
            got = [int(client.sample("q", 1, timeout=2.0).data["step"][0])
                   for _ in range(LEARNERS)]
            assert got == steps.tolist()  # every item, in order: none went to a dead learner
            assert out.empty()
            client.close()
        finally:
            for proc in learners:
                if proc.is_alive():
                    proc.kill()
                    proc.join(5.0)
