"""The example tests run in a temporary folder: a run without ``--out`` writes its files
to ``runs/<example>`` under the working directory, never into the checkout."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _in_a_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
