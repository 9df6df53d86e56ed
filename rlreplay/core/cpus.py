"""How many CPUs this process may run on: its affinity mask, lowered to a cgroup CPU quota.

Work that only pays off beside a second running thread (pre-faulting pages on another
core) is skipped where a process may run on one CPU only. A container limited to one CPU of time
(``docker --cpus=1``) sees every core of the machine in its affinity mask, but a second
thread there runs in the same budget, so the quota counts too.
"""

from __future__ import annotations

import os

CGROUP_ROOT = "/sys/fs/cgroup"  # where a CPU quota is read (cpu.max, or cpu/cpu.cfs_*_us)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cgroup_cpus() -> int | None:
    """The CPUs' worth of time a cgroup CPU quota gives (rounded up), else ``None``."""
    v2 = _read(os.path.join(CGROUP_ROOT, "cpu.max"))  # "<quota> <period>" or "max <period>"
    if v2 is not None:
        parts = v2.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[1]):
            return max(1, -(-int(parts[0]) // int(parts[1])))
        return None
    for sub in ("cpu", "cpu,cpuacct"):  # cgroup v1; a quota of -1 is none
        quota = _read(os.path.join(CGROUP_ROOT, sub, "cpu.cfs_quota_us"))
        period = _read(os.path.join(CGROUP_ROOT, sub, "cpu.cfs_period_us"))
        if quota is not None and period is not None:
            if quota.isdigit() and period.isdigit() and int(period) and int(quota):
                return max(1, -(-int(quota) // int(period)))
            return None
    return None


def cpus() -> int:
    """The CPUs this process may run on: its affinity mask, lowered to a cgroup CPU
    quota (rounded up to whole CPUs) where one is set."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_cpus()
    return n if quota is None else min(n, quota)
