"""A process killed (SIGKILL) while it saves leaves the newest published checkpoint
loadable and consistent: a half-written one is never taken."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from rlreplay import Table, checkpoint

CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from rlreplay import Prioritized, Table

    root = sys.argv[1]
    table = Table("t", signature={"step": "int64", "obs": ((512,), "float32")},
                  max_size=20000, sampler=Prioritized(0.6), seed=0)
    first = 0
    while True:
        ids = np.arange(first, first + 2000)
        table.insert({"step": ids, "obs": np.repeat(ids[:, None], 512, 1).astype(np.float32)},
                     np.linspace(0.1, 1.0, 2000))
        first += 2000
        table.checkpoint(root, keep=2)
        print(first, flush=True)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_killing_a_process_mid_save_never_leaves_a_half_checkpoint_to_load(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "ckpts"
    published_steps = []
    mid_save = 0  # trials whose kill left a save half-written (reported, not required)
    for _trial in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root)], stdout=subprocess.PIPE, text=True
        )
        try:
            ready, _, _ = select.select([child.stdout], [], [], 60.0)
            assert ready, "the child published no checkpoint within 60 s"
            first_line = child.stdout.readline()  # one checkpoint is published
            assert first_line.strip(), "the child died before its first checkpoint"
            time.sleep(float(rng.uniform(0.05, 0.6)))  # somewhere inside a later save
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            child.stdout.close()
        mid_save += any(p.name.startswith(".tmp-") for p in root.iterdir())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a damaged checkpoint would be skipped
            restored = Table.restore(root)
        cols = restored.store.columns
        steps = cols["step"][np.flatnonzero(restored.index.live)]
        assert restored.size == min(restored.store.next_id, 20000) and restored.size
        np.testing.assert_array_equal(
            cols["obs"][:, 0], cols["step"].astype(np.float32)
        )  # every row whole: obs repeats its step
        assert set(steps.tolist()) == set(
            range(restored.store.next_id - restored.size, restored.store.next_id)
        )
        published_steps.append(restored.store.next_id)
        assert len(checkpoint.list_checkpoints(root)) <= 3  # keep=2, plus one being pruned
    assert all(n % 2000 == 0 for n in published_steps)
    print(f"{mid_save} of 4 kills hit a save in progress")
    leftovers = [p.name for p in Path(root).iterdir() if p.name.startswith(".tmp-")]
    # A later save removes the temporary directories of dead processes.
    table = Table.restore(root)
    table.checkpoint(root, keep=2)
    assert not [p for p in Path(root).iterdir() if p.name in leftovers]
