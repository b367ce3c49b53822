"""The sbatch scripts follow the launchers' exit codes on a real two-node Slurm cluster on localhost
(the cluster fixture of tests/e2e/test_slurm.py): a node quarantined by a failing
--health_check is excluded when the job is requeued; a deterministic failure (70) is not requeued."""

from __future__ import annotations

import pytest
import test_slurm
from support.paths import worker
from support.slurm import Jobs

pytestmark = pytest.mark.timeout(300)  # the first cluster test may start the cluster
cluster = test_slurm.cluster  # the module's cluster fixture, shared with tests/e2e/test_slurm.py's own


@pytest.fixture
def jobs(cluster, tmp_path):
    j = Jobs(tmp_path)
    yield j
    j.cleanup()


def test_a_quarantined_node_is_excluded_when_the_job_is_requeued(jobs: Jobs, tmp_path):
    noted = tmp_path / "quarantined"
    job = jobs.submit(
        "multi_node.sbatch",
        worker("node_info.py"),
        env={
            "PET_HEALTH_CHECK": 'test "$SLURMD_NODENAME" != node2',  # node2 is unhealthy
            "LAUNCHER_QUARANTINE_FILE": str(noted),
            "SLEEP": "30",
        },
    )
    jobs.until(lambda: jobs.info(job).get("Restarts") == "1", timeout=90, job=job)
    info = jobs.wait(job, states=("PENDING",), timeout=60)
    log = jobs.log(job)
    assert info["ExcNodeList"] == "node2", log  # two nodes asked, one left: it waits, as it should
    assert noted.read_text() == "node2\n", log
    assert "quarantined by the launcher: node2" in log and "without node2" in log, log


def test_a_deterministic_failure_is_not_requeued(jobs: Jobs, tmp_path):
    job = jobs.submit(
        "single_node.sbatch",
        worker("policy_worker.py"),
        env={
            "ERROR": "loss is NaN",
            "LAUNCHER_ARGS": "--max_restarts 3",
            "LAUNCHER_QUARANTINE_FILE": str(tmp_path / "q"),
        },
    )
    info = jobs.wait(job, timeout=90)
    log = jobs.log(job)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("FAILED", "70:0", "0"), log
    assert "the failure is deterministic (exit 70): not requeueing" in log, log
