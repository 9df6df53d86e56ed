"""A source checkout has the installed package's layout, ``rlreplay.examples`` included.

Ray starts each worker with the driver's directory first on its path. A driver started
in a checkout (``python examples/apex_dqn.py --backend ray``, or the tests) therefore has
workers that import ``rlreplay`` from the checkout by path alone, without the import hook
of an editable install (absent for a user who installed the package, and for a moment
while ``pip install -e .`` reinstalls it). Those workers unpickle the example's policy
from ``rlreplay.examples``, so the checkout itself must provide it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def test_a_process_with_only_the_checkout_on_its_path_imports_the_examples(tmp_path):
    code = (
        "import importlib.util, sys, rlreplay, rlreplay.examples\n"
        "print(rlreplay.__file__)\n"
        "print(importlib.util.find_spec('rlreplay.examples.apex_dqn').origin)\n"
        "print(any('editable' in repr(f).lower() for f in sys.meta_path))\n"
    )
    # -S: no site-packages processing, so no .pth import hook; numpy's folder (where
    # the other dependencies live too) and the checkout are on the path by name only.
    path = os.pathsep.join([str(ROOT), str(Path(np.__file__).parents[1])])
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": path}, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    package, example, hooked = out.stdout.split()
    assert Path(package) == ROOT / "rlreplay" / "__init__.py"
    assert Path(example) == ROOT / "rlreplay" / "examples" / "apex_dqn.py"
    assert Path(example).resolve() == ROOT / "examples" / "apex_dqn.py"
    assert hooked == "False"
