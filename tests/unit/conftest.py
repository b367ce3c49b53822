"""The unit layer runs in process: a test here that starts a subprocess fails, and belongs in
tests/integration (one real component) or tests/e2e (real launcher runs)."""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture(autouse=True)
def no_subprocesses(monkeypatch):
    def refuse(self, args, *more, **kw):
        raise AssertionError(f"tests/unit runs in process; {args!r} belongs in tests/integration or tests/e2e")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
