"""The prefault thread that maps a new store's large columns ahead of its first fill.

Its promises: it maps at most its look-ahead past the write head, stops after the first
pass, never changes data (a fill with it equals a fill without it, bit for bit, with the
writer overtaking it and the ring wrapping), can be turned off, and leaves no thread
running when no store has pages to map. The thresholds are lowered here so that a few
MB of columns exercise it.
"""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

from rlreplay import Table
from rlreplay.core import cpus, prefault, storage
from rlreplay.core.storage import StepStore
from rlreplay.errors import InvalidArgumentError

MB = 1 << 20
SIG = {"obs": ((1024,), "uint8"), "reward": "float32"}  # obs: 1 KB a row, reward small


def _populate_works() -> bool:
    if prefault._madvise is None:
        return False
    probe = np.zeros(1 << 16, np.uint8)
    base = probe.ctypes.data
    start = (base + 4095) & ~4095
    return prefault._madvise(start, 4096, prefault.MADV_POPULATE_WRITE) == 0


pytestmark = pytest.mark.skipif(
    not _populate_works() or cpus.cpus() < 2,
    reason="madvise(MADV_POPULATE_WRITE) needs Linux 5.14 or later, and a second CPU",
)


@pytest.fixture(autouse=True)
def small_thresholds(monkeypatch):
    """Columns of 1 MB or more are prefaulted, 2 MB ahead, in steps of 512 KB."""
    monkeypatch.delenv(prefault.VARIABLE, raising=False)
    monkeypatch.setattr(prefault, "MIN_COLUMN_BYTES", 1 * MB)
    monkeypatch.setattr(prefault, "LOOKAHEAD_BYTES", 2 * MB)
    monkeypatch.setattr(prefault, "STEP_BYTES", MB // 2)
    yield
    wait_idle()


def wait_idle(timeout: float = 10.0) -> None:
    """Wait (bounded) for the prefault thread to end; fail if it does not."""
    deadline = time.monotonic() + timeout
    while (thread := prefault.running_thread()) is not None:
        left = deadline - time.monotonic()
        assert left > 0, "the prefault thread is still running"
        thread.join(min(left, 0.5))


def rows(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.integers(0, 256, (n, 1024), dtype=np.uint8),
        "reward": rng.random(n, dtype=np.float32),
    }


def resident_bytes(col: np.ndarray) -> int:
    """Bytes of the pages of ``col`` the process has mapped (``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    start = col.ctypes.data & ~4095
    length = col.ctypes.data + col.nbytes - start
    pages = -(-length // 4096)
    vec = np.zeros(pages, np.uint8)
    assert libc.mincore(start, length, vec.ctypes.data) == 0, ctypes.get_errno()
    return int((vec & 1).sum()) * 4096


def test_only_stores_with_large_new_columns_get_a_prefaulter(monkeypatch):
    assert StepStore(SIG, capacity=4096).prefaulter is not None  # obs: 4 MB
    small = StepStore(SIG, capacity=512)  # obs: 512 KB
    assert small.prefaulter is None and small.observers == ()
    given = {"obs": np.zeros((4096, 1024), np.uint8), "reward": np.zeros(4096, np.float32)}
    assert StepStore(SIG, capacity=4096, columns=given).prefaulter is None
    store = StepStore(SIG, capacity=4096)
    assert [c.shape for c in store.prefaulter.columns] == [(4096, 1024)]  # not reward
    assert prefault.running_thread() is None  # nothing starts before the first write


def test_it_maps_at_most_its_lookahead_past_the_write_head():
    store = StepStore(SIG, capacity=64 * 1024)  # obs: 64 MB, never filled
    pf = store.prefaulter
    assert pf.lookahead_rows == 2048 and pf.step_rows == 512
    # construction commits nothing (but maybe the allocator's header page, or huge page);
    # an allocator that hands back memory this process touched before (a heap grown by
    # earlier allocations, as after a whole test session's imports) leaves nothing to judge
    if resident_bytes(store.columns["obs"]) > 2 * MB:
        pytest.skip("the allocator returned pages already mapped: residency says nothing")
    store.append(rows(1, 0))
    wait_idle()
    assert 2048 <= pf.mapped_rows <= store.next_id + pf.lookahead_rows
    # what was mapped: the look-ahead, give or take a huge page at either end
    assert 2 * MB <= resident_bytes(store.columns["obs"]) <= 6 * MB
    assert pf.wake == pf.mapped_rows - pf.lookahead_rows // 2
    for _ in range(4):  # writes below the wake row do not call on the thread
        store.append(rows(100, 1))
        assert prefault.running_thread() is None
    store.append(rows(700, 2))
    store.append(rows(1, 3))  # its first row is past the wake row: the thread maps further
    wait_idle()
    # (the thread may have read the head before or after that write)
    assert store.next_id - 1 + pf.lookahead_rows <= pf.mapped_rows
    assert pf.mapped_rows <= store.next_id + pf.lookahead_rows
    assert resident_bytes(store.columns["obs"]) <= 8 * MB


def test_it_stops_after_the_first_pass_and_the_thread_ends():
    store = StepStore(SIG, capacity=4096)
    for i in range(40):  # 4096 rows in batches of 128, then around the ring again
        store.append(rows(128, i))
    wait_idle()
    assert store.prefaulter.done
    assert store.prefaulter.wake == prefault.NEVER
    store.append(rows(128, 99))
    assert prefault.running_thread() is None


def fill(store: StepStore, sizes: list[int]) -> None:
    for i, n in enumerate(sizes):
        store.append(rows(n, i))


FILLS = {
    # batches of odd sizes: the ring wraps mid-batch, twice
    "wraps": [300, 1, 777, 1500, 2000, 64, 3000, 999, 1],
    # one batch beyond the look-ahead: the writer overtakes the thread
    "overtakes": [1, 3500, 10, 500, 2000],
    # many small batches racing the thread over the same pages
    "races": [37] * 250,
}


@pytest.mark.parametrize("sizes", FILLS.values(), ids=FILLS.keys())
def test_a_fill_with_the_prefaulter_equals_one_without_bit_for_bit(monkeypatch, sizes):
    on = StepStore(SIG, capacity=4096)
    monkeypatch.setenv(prefault.VARIABLE, "0")
    off = StepStore(SIG, capacity=4096)
    assert on.prefaulter is not None and off.prefaulter is None
    fill(on, sizes)
    fill(off, sizes)
    wait_idle()
    assert on.next_id == off.next_id
    for path in SIG:
        np.testing.assert_array_equal(on.columns[path], off.columns[path], path)


def test_populating_written_pages_leaves_their_data():
    store = StepStore(SIG, capacity=4096)
    fill(store, [1000, 1000])
    wait_idle()
    before = store.columns["obs"].copy()
    # pages written, pages mapped, pages fresh, all at once
    prefault.ColumnPrefaulter(store, [store.columns["obs"]]).populate(0, 4096)
    np.testing.assert_array_equal(store.columns["obs"], before)
    assert not store.columns["obs"][2000:].any()


def test_the_numpy_write_path_fills_alike(monkeypatch):
    """The same fills through the store's numpy writes (no compiled kernel)."""
    fast = StepStore(SIG, capacity=4096)
    fill(fast, FILLS["wraps"])
    monkeypatch.setattr(storage, "_kernel", None)
    slow = StepStore(SIG, capacity=4096)
    assert slow.prefaulter is not None
    fill(slow, FILLS["wraps"])
    wait_idle()
    for path in SIG:
        np.testing.assert_array_equal(fast.columns[path], slow.columns[path], path)


def test_large_batches_copied_without_the_gil_match_the_numpy_path(monkeypatch):
    """put_rows copies batches of 1 MB or more with the GIL released."""
    sig = {"frame": ((84, 84, 4), "uint8"), "reward": "float32"}
    batch = {
        "frame": np.random.default_rng(0).integers(0, 256, (64, 84, 84, 4), dtype=np.uint8),
        "reward": np.arange(64, dtype=np.float32),
    }
    if storage._kernel is None:
        pytest.skip("the compiled store kernel is not built or turned off")
    fast = Table("t", signature=sig, max_size=200)
    for _ in range(4):  # 256 rows into 200: the last batch wraps
        fast.insert(batch)
    monkeypatch.setattr(storage, "_kernel", None)
    slow = Table("t", signature=sig, max_size=200)
    for _ in range(4):
        slow.insert(batch)
    for path in sig:
        np.testing.assert_array_equal(fast.store.columns[path], slow.store.columns[path])


def test_reset_and_load_state_do_not_confuse_it(monkeypatch):
    store = StepStore(SIG, capacity=4096)
    fill(store, [1500])
    store.reset()  # rows stay mapped; the thread goes on from what it mapped
    fill(store, [300, 3000])
    wait_idle()
    monkeypatch.setenv(prefault.VARIABLE, "0")
    ref = StepStore(SIG, capacity=4096)
    fill(ref, [1500])
    ref.reset()
    fill(ref, [300, 3000])
    np.testing.assert_array_equal(store.columns["obs"], ref.columns["obs"])

    fresh = StepStore(SIG, capacity=4096)
    monkeypatch.delenv(prefault.VARIABLE)
    restored = StepStore(SIG, capacity=4096)
    pf = weakref.ref(restored.prefaulter)
    restored.append(rows(1, 0))
    restored.load_state({"next_id": 0}, columns=fresh.columns)  # e.g. mapped files
    assert restored.prefaulter is None and restored.observers == ()
    wait_idle()
    gc.collect()
    assert pf() is None  # nothing holds it, nor the columns it held
    fill(restored, [2000])
    assert prefault.running_thread() is None


def test_a_dropped_store_is_let_go():
    store = StepStore(SIG, capacity=64 * 1024)
    store.append(rows(1, 0))
    pf = weakref.ref(store.prefaulter)
    col = weakref.ref(store.columns["obs"])
    del store
    gc.collect()
    wait_idle()
    gc.collect()
    assert pf() is None and col() is None


def test_off_switch_and_a_malformed_value(monkeypatch):
    monkeypatch.setenv(prefault.VARIABLE, "0")
    store = StepStore(SIG, capacity=4096)
    assert store.prefaulter is None
    fill(store, [4096, 100])
    assert prefault.running_thread() is None
    monkeypatch.setenv(prefault.VARIABLE, "yes")
    with pytest.raises(InvalidArgumentError, match=prefault.VARIABLE):
        StepStore(SIG, capacity=4096)
    monkeypatch.setenv(prefault.VARIABLE, "1")
    assert StepStore(SIG, capacity=4096).prefaulter is not None


def test_the_interpreter_exits_while_the_thread_maps():
    code = (
        "import numpy as np\n"
        "from rlreplay.core import prefault\n"
        "from rlreplay.core.storage import StepStore\n"
        "prefault.LOOKAHEAD_BYTES = 512 << 20\n"
        "s = StepStore({'obs': ((1 << 20,), 'uint8')}, capacity=1024)\n"
        "s.append({'obs': np.ones((1, 1 << 20), np.uint8)})\n"
        "print(prefault.running_thread() is not None)\n"  # mapping still (almost always)
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert time.monotonic() - started < 30


def test_a_process_on_one_cpu_does_not_prefault():
    code = (
        "import os\n"
        "from rlreplay.core.storage import StepStore\n"
        "cpus = os.sched_getaffinity(0)\n"
        "os.sched_setaffinity(0, {min(cpus)})\n"
        "assert StepStore({'obs': ((1 << 20,), 'uint8')}, capacity=128).prefaulter is None\n"
        "os.sched_setaffinity(0, cpus)\n"
        "assert StepStore({'obs': ((1 << 20,), 'uint8')}, capacity=128).prefaulter is not None\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()


def test_a_thread_that_cannot_start_leaves_writes_working():
    # A process at its thread limit (RLIMIT_NPROC here; a container's pids limit, or
    # Python 3.12+ during interpreter shutdown): the write goes on and maps its own pages.
    code = (
        "import os, resource\n"
        "import numpy as np\n"
        "from rlreplay.core import prefault\n"
        "from rlreplay.core.storage import StepStore\n"
        "if os.getuid() == 0:\n"
        "    os.setgid(65534); os.setuid(65534)\n"  # root ignores RLIMIT_NPROC
        "hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NPROC, (1, hard))\n"
        "s = StepStore({'obs': ((1 << 20,), 'uint8')}, capacity=128)\n"
        "assert s.prefaulter is not None\n"
        "rows = np.arange(4 << 20, dtype=np.uint32).view(np.uint8).reshape(16, 1 << 20)\n"
        "s.append({'obs': rows})\n"
        "s.append({'obs': rows})\n"
        "assert (s.read(np.arange(16, 32))['obs'] == rows).all()\n"
        "assert prefault.running_thread() is None\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    if b"PermissionError" in done.stderr:
        pytest.skip("cannot drop to an unprivileged user here")
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.strip() == b"ok"


@pytest.mark.parametrize(
    "files, prefaulted",
    [
        ({"cpu.max": "100000 100000\n"}, False),  # docker --cpus=1, cgroup v2
        ({"cpu.max": "50000 100000\n"}, False),
        ({"cpu.max": "150000 100000\n"}, True),
        ({"cpu.max": "max 100000\n"}, True),
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, False),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, True),
        ({}, True),
    ],
    ids=["v2-one-cpu", "v2-half", "v2-one-and-a-half", "v2-none", "v1-one", "v1-none", "no-files"],
)
def test_a_cgroup_quota_of_one_cpu_counts_as_one_cpu(monkeypatch, tmp_path, files, prefaulted):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(cpus, "CGROUP_ROOT", str(tmp_path))
    store = StepStore(SIG, capacity=2048)
    assert (store.prefaulter is not None) is prefaulted


class _PausingStore(StepStore):
    """A store whose head, read by the prefault thread once it has mapped its whole
    look-ahead, pauses that thread (up to a second) for ``pause()`` to run meanwhile:
    the thread is then between its check that the prefaulter is not stopped and its
    setting of the wake row, as a thread switch may leave it."""

    def __init__(self, *args, **kwargs):
        self.pause = None
        super().__init__(*args, **kwargs)

    @property
    def next_id(self) -> int:
        pf = getattr(self, "prefaulter", None)
        if (
            self.pause is not None
            and threading.current_thread().name == "rlreplay-prefault"
            and pf is not None
            and pf.mapped_rows >= self._head + pf.lookahead_rows
        ):
            pause, self.pause = self.pause, None
            pause()
        return self._head

    @next_id.setter
    def next_id(self, value: int) -> None:
        self._head = value


def test_columns_replaced_while_the_thread_sets_the_wake_row_leave_writes_working():
    store = _PausingStore(SIG, capacity=4096)
    fresh = StepStore(SIG, capacity=4096).columns
    replaced = threading.Event()
    loader = threading.Thread(
        target=lambda: (store.load_state({"next_id": 1}, columns=fresh), replaced.set())
    )
    store.pause = lambda: (loader.start(), replaced.wait(1.0))
    store.append(rows(1, 0))
    wait_idle()
    loader.join(10)
    assert replaced.is_set() and store.prefaulter is None
    assert store.observers == ()  # whatever wake row the thread set, writes do not see it
    fill(store, [3000])  # every row up to the wake row the thread computed, and past it
    assert store.next_id == 3001


def test_cpus_counts_at_least_one():
    assert cpus.cpus() >= 1
