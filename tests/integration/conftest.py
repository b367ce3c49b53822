"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest

from launcher.tcpstore import StoreServer


@pytest.fixture
def server():
    """Our TCPStore server on 127.0.0.1 at a free port, closed after the test."""
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.close()
