"""torch for a test module, not at its collection: torch takes ~2 s of CPU to import, and every xdist
worker collects every module, so one module importing it at its head cost each worker that import at the
suite's start (where five workers and nothing else compete for the cores). Such a module imports torch in
a module-scoped fixture (`global torch` ...; its helpers only use it in their bodies), and skips, without
importing it, where it is missing."""

from __future__ import annotations

from importlib.util import find_spec

import pytest

MISSING = "torch is not installed (pip install torch)" if find_spec("torch") is None else ""
torch = pytest.mark.skipif(bool(MISSING), reason=MISSING)
