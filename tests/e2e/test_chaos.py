"""A short run of the randomized fault campaign (scripts/chaos.py): two seeded episodes per backend,
each a real 3-node elastic job with faults at random times, every invariant checked. The seeds are
fixed so that a failure here replays with the command in the message. As root (network namespaces,
a tmpfs) they exercise the link cut and, on etcd, a 3-member cluster losing its leader; without root
the same seeds draw from the faults that need neither."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from support.paths import ROOT

# As root: c10d 164, a node's link cut for 4.6 s (the others re-form without it), then 165, a worker
# SIGKILLed; etcd 169, the etcd leader SIGKILLed and restarted (ridden out), then 170, a link cut.
SEEDS, EPISODES = {"c10d": 164, "etcd": 169}, 2


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_a_short_fault_campaign_breaks_no_invariant(backend):
    if backend == "etcd" and shutil.which("etcd") is None:
        pytest.skip("no etcd binary on PATH")
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "chaos.py"),
        "--backend",
        backend,
        "--episodes",
        str(EPISODES),
        "--seed",
        str(SEEDS[backend]),
        "--bound",
        "45",
        "--verbose",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=140, cwd=ROOT)
    assert r.returncode == 0, f"{' '.join(cmd[1:])}\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert f"{backend}: {EPISODES} episodes, 0 with violations" in r.stdout, r.stdout
