"""The in-place state transfer over a real gloo group of two processes: tensors land in the
receiver's fresh (faulted in first), non-contiguous or missing tensors, every value intact."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.paths import ROOT, worker
from support.ports import free_port

pytestmark = pytest.mark.timeout(90)


def test_the_state_lands_whole_in_the_receivers_own_tensors():
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, worker("in_place_transfer.py"), str(rank), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=75)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "received ok" in outs[1], outs
