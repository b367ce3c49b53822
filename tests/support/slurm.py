"""Slurm for the tests: a job step's environment, and a two-node cluster on localhost
(tests/slurm_cluster.sh) whose sbatch jobs `Jobs` submits, watches and cancels."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from support import system
from support.paths import ROOT
from support.processes import kill_leftovers

SCRIPTS = ROOT / "scripts" / "slurm"
CLUSTER = ROOT / "tests" / "slurm_cluster.sh"


def step_env(**kw) -> dict:
    """The SLURM_* variables of step 0 on node 1 of a 3-node job (`KEY=None` leaves KEY out)."""
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "node[1-3]",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_NODELIST": "node[1-3]",
        "SLURM_STEP_NODELIST": "node[2-3]",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_NODEID": "1",
    }
    env.update(kw)
    return {k: v for k, v in env.items() if v is not None}


def cluster_skip_reason() -> str | None:
    """Why a Slurm cluster cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return "Slurm on localhost needs Linux"
    if system.NO_SYSTEM:
        return system.SKIPPED
    if os.geteuid() != 0:
        return "starting munged/slurmctld/slurmd and naming node1/node2 in /etc/hosts needs root"
    if not shutil.which("apt-get") and not (shutil.which("slurmctld") and shutil.which("slurmd")):
        return "no Slurm daemons (slurmctld, slurmd) and no apt-get to install them"
    return None


class Jobs:
    """Submits the sbatch scripts with a unique TEST_TOKEN; cancels its jobs and leftovers at the end."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.token = uuid.uuid4().hex
        self.ids: list[str] = []

    def submit(self, script: str, *args: str, env: dict | None = None, sbatch: tuple[str, ...] = ()) -> str:
        full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "SBATCH_"))}
        full.update(PYTHON=sys.executable, OMP_NUM_THREADS="1", TEST_TOKEN=self.token, PYTHONPATH=str(ROOT))
        full.pop("PYTEST_CURRENT_TEST", None)
        full.update(env or {})
        out = subprocess.run(
            ["sbatch", "--parsable", "-o", str(self.tmp / "%j.out"), *sbatch, str(SCRIPTS / script), *args],
            capture_output=True,
            text=True,
            env=full,
            cwd=ROOT,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        job = out.stdout.strip().split(";")[0]
        self.ids.append(job)
        return job

    def log(self, job: str) -> str:
        path = self.tmp / f"{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def info(self, job: str) -> dict:
        out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30)
        return dict(re.findall(r"(\w+)=(\S*)", out.stdout))

    def wait(
        self,
        job: str,
        states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"),
        timeout: float = 90,
    ) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.info(job)
            if info.get("JobState") in states:
                return info
            time.sleep(0.3)
        raise AssertionError(f"job {job} still {self.info(job).get('JobState')} after {timeout} s:\n{self.log(job)}")

    def until(self, what, timeout: float = 60, job: str | None = None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if what():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out; log:\n{self.log(job) if job else ''}")

    def cleanup(self) -> None:
        if self.ids:
            subprocess.run(["scancel", *self.ids], capture_output=True, timeout=30)
        kill_leftovers([], self.token, settle=15)
