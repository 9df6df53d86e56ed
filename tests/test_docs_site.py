"""The documentation site builds with ``mkdocs build --strict``.

Strict mode fails on any warning: a page of ``docs/`` missing from ``mkdocs.yml``'s nav, a
broken link or anchor, and every docstring of the API reference that mkdocstrings cannot
read (a parameter documented but not in the signature, a malformed ``Raises:`` entry).
The pages' code examples are run by ``tests/test_doc_examples.py``. mkdocs and its
plugins come with the ``test`` extra (and the ``docs`` extra).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs site needs the docs extra: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        # Not --quiet: it hides the warnings that --strict turns into a failure.
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    table_page = (site / "api" / "table" / "index.html").read_text()
    assert "max_times_sampled" in table_page  # the reference is rendered from docstrings
    assert ":class:" not in table_page  # Sphinx roles are shown as code (docs/griffe_roles.py)


def test_every_docs_page_is_in_the_nav():
    import yaml

    def pages(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            if isinstance(value, list):
                yield from pages(value)
            else:
                yield value

    class Loader(yaml.SafeLoader):  # mkdocs.yml may hold !!python/name tags
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    nav = set(pages(yaml.load((ROOT / "mkdocs.yml").read_text(), Loader)["nav"]))
    docs = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert docs - nav == set(), "add these pages to mkdocs.yml's nav"
    assert nav - docs == set(), "the nav names pages that do not exist"
