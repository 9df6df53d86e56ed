"""Project-wide checks: the package imports lean and fast, and the code is ruff-clean."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "jax", "ray", "zmq", "gymnasium", "tensorflow", "msgpack")


def test_import_rlreplay_pulls_in_no_optional_dependency():
    code = f"import sys, rlreplay; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_code_is_ruff_clean():
    out = subprocess.run(["ruff", "check", str(ROOT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
