"""Run Reverb's own Python tests of its numpy client against ``rlreplay.reverb``.

Given a checkout of google-deepmind/reverb (a directory holding ``reverb/client_test.py``;
nothing is fetched), each test file runs in its own interpreter with ``rlreplay.reverb``
registered as ``reverb`` and TensorFlow replaced by a small stand-in (``TensorSpec`` and
dtypes over numpy, written to a temporary directory; TensorFlow is never imported)::

    pip install absl-py dm-tree portpicker      # what the tests import (not rlreplay's deps)
    python benchmarks/reverb_tests.py /path/to/reverb [--only client_test]

The files: ``reverb/client_test.py``, ``reverb/server_test.py``,
``reverb/rate_limiters_test.py``, ``reverb/replay_sample_test.py`` and the
``TrajectoryColumnTest`` class of ``reverb/trajectory_writer_test.py``. Prints each file's
unittest summary and exits 1 if any failed. The results, and the assertions that cannot
apply: docs/coming_from_reverb.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = {
    "client_test": [],
    "server_test": [],
    "rate_limiters_test": [],
    "replay_sample_test": [],
    "trajectory_writer_test": ["TrajectoryColumnTest"],
}

# A TensorFlow stand-in: what the tests use of `tensorflow` (TensorSpec, dtypes).
STAND_IN = '''"""TensorFlow stand-in for running Reverb's numpy-client tests on rlreplay.reverb."""
import numpy as np
from rlreplay.reverb.specs import TensorSpec as _Spec


class DType:
    def __init__(self, dtype):
        self.as_numpy_dtype = np.dtype(dtype).type
        self.name = np.dtype(dtype).name

    def __eq__(self, other):
        try:
            other = np.dtype(getattr(other, "as_numpy_dtype", other))
            return other == np.dtype(self.as_numpy_dtype)
        except TypeError:
            return False

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return "tf." + self.name


for _name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
              "uint64", "float16", "float32", "float64", "complex64", "complex128"):
    globals()[_name] = DType(_name)
double, half = float64, float16


class TensorSpec(_Spec):
    __slots__ = ()

    def __init__(self, shape, dtype=float32, name=None):
        super().__init__(shape, dtype, name)


class TensorShape(tuple):
    def __new__(cls, dims):
        return super().__new__(cls, dims)
'''


def write_stand_in(root: Path) -> None:
    pkg = root / "tensorflow"
    (pkg / "compat" / "v1").mkdir(parents=True)
    (pkg / "__init__.py").write_text(STAND_IN + "\nfrom tensorflow import compat\n")
    (pkg / "compat" / "__init__.py").write_text("from tensorflow.compat import v1\n")
    (pkg / "compat" / "v1" / "__init__.py").write_text("from tensorflow import *  # noqa\n")


RUNNER = """import sys, runpy
import rlreplay.reverb
rlreplay.reverb.install_as_reverb()
path = sys.argv[1]
sys.argv = [path] + sys.argv[2:]
runpy.run_path(path, run_name="__main__")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", help="a directory holding reverb/client_test.py")
    parser.add_argument("--only", nargs="*", choices=sorted(TESTS), help="these files only")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per file")
    args = parser.parse_args()
    source = Path(args.checkout) / "reverb"
    if not (source / "client_test.py").exists():
        parser.error(f"{source / 'client_test.py'} does not exist; give a Reverb checkout")
    repo = Path(__file__).resolve().parent.parent
    failed = False
    with tempfile.TemporaryDirectory(prefix="reverb_tests_") as tmp:
        tmp_path = Path(tmp)
        write_stand_in(tmp_path)
        (tmp_path / "run_test.py").write_text(RUNNER)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tmp_path), str(repo), *filter(None, [env.get("PYTHONPATH")])]
        )
        for name in args.only or TESTS:
            cmd = [
                sys.executable,
                str(tmp_path / "run_test.py"),
                str(source / f"{name}.py"),
                *TESTS[name],
            ]
            print(f"=== {name} {' '.join(TESTS[name])}", flush=True)
            try:
                proc = subprocess.run(
                    cmd, env=env, cwd=tmp, timeout=args.timeout, capture_output=True, text=True
                )
            except subprocess.TimeoutExpired:
                print(f"{name}: did not finish within {args.timeout} s")
                failed = True
                continue
            out = proc.stdout + proc.stderr
            print(out if proc.returncode else "\n".join(out.strip().splitlines()[-3:]))
            failed |= proc.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
