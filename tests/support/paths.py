"""Where things are: the checkout, the tests' worker scripts, the launcher's command line."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "tests" / "workers"
LAUNCHER = [sys.executable, "-m", "launcher"]


def worker(name: str) -> str:
    """Path of a tiny worker script in tests/workers/."""
    return str(WORKERS / name)
