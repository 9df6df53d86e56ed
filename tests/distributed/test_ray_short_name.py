"""``rlreplay.ray`` is the scale-out layer's Ray helpers under the package's short name,
importable without Ray."""

from __future__ import annotations

import subprocess
import sys

import rlreplay.distributed.ray as distributed_ray


def test_the_short_name_gives_the_same_helpers():
    import rlreplay.ray as short

    assert short.start_shards is distributed_ray.start_shards
    assert short.RayShards is distributed_ray.RayShards


def test_importing_the_short_name_does_not_import_ray():
    code = "import sys, rlreplay.ray; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
