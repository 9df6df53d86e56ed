"""Without an optional extra's packages, the names that need them say which extra to
install (each check in a fresh interpreter whose imports of the package are refused)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    ("zmq", "import rlreplay; rlreplay.ShardedClient", r"rlreplay.ShardedClient needs"),
    ("msgpack", "import rlreplay; rlreplay.Client", r"rlreplay.Client needs"),
    ("ray", "from rlreplay.ray import start_shards; "
            "start_shards({'table': []}, 2, num_cpus=0)", r"needs Ray"),
]


@pytest.mark.parametrize(("missing", "code", "says"), CASES, ids=[c[0] for c in CASES])
def test_a_missing_extra_is_named_with_its_install_command(missing, code, says):
    run = f"import sys; sys.modules[{missing!r}] = None\n{code}"
    out = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and says in last, out.stderr
    extra = "ray" if missing == "ray" else "net"
    assert f"pip install 'rlreplay[{extra}]'" in last
