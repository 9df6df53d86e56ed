"""Importing the network layer from two threads at once, by the two paths users take
(``rlreplay.ShardedClient`` / ``rlreplay.Client`` and ``from rlreplay.net import
Client``), works: each fresh interpreter imports both without an ImportError."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("zmq")

SCRIPT = """
import threading
import rlreplay

errors = []

def lazy():
    try:
        rlreplay.ShardedClient
    except Exception as error:
        errors.append(repr(error))

def direct():
    try:
        from rlreplay.net import Client  # noqa: F401
    except Exception as error:
        errors.append(repr(error))

threads = [threading.Thread(target=lazy), threading.Thread(target=direct)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
assert not any(t.is_alive() for t in threads), "an import hung"
print(errors)
raise SystemExit(1 if errors else 0)
"""


def test_two_threads_importing_the_network_layer_by_both_paths_both_succeed():
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, done.stdout + done.stderr
