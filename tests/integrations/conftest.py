"""SB3's logger writes into a new folder under the system's temporary directory at every
``learn()``; the tests give it their own temporary folder, so that none is left behind."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _sb3_log_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path / "sb3_log"))
