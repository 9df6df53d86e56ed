"""A client of each module's ``server`` fixture; every table is emptied after each test."""

from __future__ import annotations

import pytest


@pytest.fixture
def client(server):
    c = server.localhost_client()
    yield c
    for table in c.server_info():
        c.reset(table)
