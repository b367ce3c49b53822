"""A short run of the randomized fault campaign (scripts/chaos.py): a few seeded episodes on c10d
and on etcd, each a real 3-node elastic job with faults at random times, every invariant checked.
The seeds are fixed so that a failure here replays with the command in the message."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

# Seed 6: a node frozen, then a worker SIGKILLed on another; seed 7: an agent SIGKILLed.
SEED, EPISODES = 6, 2


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_a_short_fault_campaign_breaks_no_invariant(backend):
    if backend == "etcd" and shutil.which("etcd") is None:
        pytest.skip("no etcd binary on PATH")
    cmd = [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--backend", backend, "--episodes", str(EPISODES),
           "--seed", str(SEED), "--bound", "45", "--verbose"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=140, cwd=ROOT)
    assert r.returncode == 0, f"{' '.join(cmd[1:])}\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert f"{backend}: {EPISODES} episodes, 0 with violations" in r.stdout, r.stdout
