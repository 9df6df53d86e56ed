"""Project-wide checks: the package imports lean and fast, its extras install lean, and the
code is ruff-clean."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "jax", "ray", "zmq", "gymnasium", "tensorflow", "msgpack")
# Deep-learning frameworks: users bring their own build (CPU or CUDA), so no extra that
# CI installs picks one.
FRAMEWORKS = ("torch", "jax", "jaxlib", "tensorflow")


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]


def requirement_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


def test_import_rlreplay_pulls_in_no_optional_dependency():
    code = f"import sys, rlreplay; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_no_extra_pins_an_exact_version():
    pinned = [r for reqs in extras().values() for r in reqs if "==" in r or "===" in r]
    assert pinned == [], "extras take version ranges, never exact pins"


def test_the_test_extra_needs_no_deep_learning_framework():
    names = {requirement_name(r) for r in extras()["test"]}
    assert names.isdisjoint(FRAMEWORKS), names & set(FRAMEWORKS)


def test_the_test_extra_installs_ray_so_that_the_ray_backend_is_tested():
    (ray,) = [r for r in extras()["test"] if requirement_name(r) == "ray"]
    assert ">=" in ray and "<" in ray.replace("<=", ""), ray  # a range, with a ceiling


def test_the_torch_extra_is_a_lower_bounded_range():
    (torch,) = extras()["torch"]
    assert requirement_name(torch) == "torch" and ">=" in torch


def test_ci_installs_torch_first_then_runs_exactly_the_readme_test_command():
    setup_block = (ROOT / "README.md").read_text().split("```")[1]
    (readme_command,) = [
        ln.split("#")[0].strip() for ln in setup_block.splitlines() if "[test]" in ln
    ]
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [ln for ln in lines if ln and not ln.startswith(("#", "set ", "cd "))]
    assert commands[0].startswith("python -m pip install -q torch==")
    assert commands[1] == readme_command


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_code_is_ruff_clean():
    out = subprocess.run(["ruff", "check", "--no-cache", str(ROOT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
