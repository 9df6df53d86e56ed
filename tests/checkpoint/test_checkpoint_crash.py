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
from checkpoint_ops import only_table

from rlreplay import Table, checkpoint

CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from rlreplay import Prioritized, Table, checkpoint

    root = sys.argv[1]
    table = Table("t", signature={"step": "int64", "obs": ((512,), "float32")},
                  max_size=20000, sampler=Prioritized(0.6), seed=0)
    first = 0
    while True:
        ids = np.arange(first, first + 2000)
        table.insert({"step": ids, "obs": np.repeat(ids[:, None], 512, 1).astype(np.float32)},
                     np.linspace(0.1, 1.0, 2000))
        first += 2000
        checkpoint.save(table, root, keep=2)
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
            restored = only_table(root)
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
    table = only_table(root)
    checkpoint.save(table, root, keep=2)
    assert not [p for p in Path(root).iterdir() if p.name in leftovers]


SAVER_ELSEWHERE = textwrap.dedent(
    """
    import os, sys
    root, target = sys.argv[1], int(sys.argv[2])
    while True:  # pids in a new namespace are handed out in order: fork up to the target
        pid = os.fork()
        if pid == 0:
            if os.getpid() != target:
                os._exit(0)
            break
        os.waitpid(pid, 0)
        if pid >= target:
            sys.exit(0 if pid == target else 3)
    import numpy as np
    from rlreplay import Table
    from rlreplay.checkpoint.save import StepwiseSave
    table = Table("t", signature={"x": "int64"}, max_size=100, seed=0)
    table.insert({"x": np.arange(10)})
    steps = StepwiseSave(table, root)
    while not steps.done:
        steps.step()
    print("moment", flush=True)  # its temporary directory, named with this pid, is there
    sys.stdin.readline()
    print(steps.write().name, flush=True)
    os._exit(0)
    """
)


def _a_pid_free_here() -> int:
    for pid in range(300, 30000):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    pytest.skip("no free pid found")


def test_a_save_does_not_delete_the_temporary_directory_of_a_saver_in_another_pid_namespace(
    tmp_path,
):
    """A saver in another container sharing the directory (its own pid namespace) has a
    pid that means nothing here: a save here must not take its directory for a dead
    process's and delete it mid-save."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("needs root on Linux for a new pid namespace (unshare)")
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare --pid is not available here")
    root = tmp_path / "ckpts"
    target = _a_pid_free_here()
    saver = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            sys.executable,
            "-c",
            SAVER_ELSEWHERE,
            str(root),
            str(target),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([saver.stdout], [], [], 60.0)
        assert ready and saver.stdout.readline().strip() == "moment"
        assert [p.name for p in root.iterdir() if f"-{target}-" in p.name]
        table = Table("u", signature={"x": "int64"}, max_size=100, seed=0)
        checkpoint.save(table, root)  # prunes what dead processes left
        saver.stdin.write("\n")
        saver.stdin.flush()
        ready, _, _ = select.select([saver.stdout], [], [], 60.0)
        assert ready
        published = saver.stdout.readline().strip()
    finally:
        saver.kill()
        saver.wait(10)
    assert published.startswith("ckpt-"), "the other namespace's save failed"
    assert len(checkpoint.list_checkpoints(root)) == 2
