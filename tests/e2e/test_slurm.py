"""Slurm: topology defaults from SLURM_* through the CLI, and the sbatch scripts in
scripts/slurm/ on a real two-node Slurm cluster on localhost (tests/slurm_cluster.sh: one
slurmctld, two slurmd "nodes" node1/node2, munged; set up once for the module, torn down after),
including what they do with the launchers' exit codes: a node quarantined by a failing
--health_check is excluded when the job is requeued; a deterministic failure (70) is not requeued.
One module holds every cluster test, so that no two xdist workers share the cluster.

The cluster part needs root (daemons, /etc/hosts entries for node1/node2) and the Debian Slurm
packages (scripts/setup.sh installs them); it is skipped, with the reason, where it cannot run.
The topology rules as pure functions: tests/unit/test_slurm_topology.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import system
from support.paths import LAUNCHER, ROOT, worker
from support.ports import free_port
from support.processes import procs_with_token, wait_gone
from support.slurm import CLUSTER, Jobs, cluster_skip_reason, step_env

# The first cluster test may include installing Slurm (when scripts/setup.sh could not) in its set-up.
pytestmark = pytest.mark.timeout(300)


# ---------------------------------------------------------------------- through the real CLI


def cli(tmp_path, args, env):
    dump = tmp_path / "dump"
    dump.mkdir(exist_ok=True)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))}
    full.update(env, DUMP_DIR=str(dump), PYTHONPATH=str(ROOT))
    p = subprocess.run([*LAUNCHER, *args], capture_output=True, text=True, env=full, timeout=60)
    dumps = {int(f.stem): json.loads(f.read_text()) for f in dump.glob("*.json")}
    return p, dumps


def test_cli_takes_the_topology_from_the_step(tmp_path):
    env = step_env(
        SLURM_STEP_NODELIST="localhost",
        SLURM_STEP_NUM_NODES="1",
        SLURM_NTASKS="1",
        SLURM_STEP_NUM_TASKS="1",
        SLURM_NODEID="0",
    )
    p, dumps = cli(tmp_path, ["--nproc_per_node", "2", worker("dump_env.py")], env)
    assert p.returncode == 0, p.stderr
    assert sorted(dumps) == [0, 1] and dumps[0]["env"]["WORLD_SIZE"] == "2"


def test_cli_flags_and_pet_variables_beat_slurm(tmp_path):
    # A two-node step; --nnodes 1 on the command line and PET_MASTER_PORT win, the rest is Slurm's.
    env = step_env(SLURM_STEP_NODELIST="localhost,elsewhere", SLURM_NODEID="0", PET_MASTER_PORT="23456")
    p, dumps = cli(tmp_path, ["--nnodes", "1", "--nproc_per_node", "1", worker("dump_env.py")], env)
    assert p.returncode == 0, p.stderr
    e = dumps[0]["env"]
    assert (e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) == ("1", "localhost", "23456")


def test_cli_bad_topology_is_one_line_exit_2(tmp_path):
    p, dumps = cli(tmp_path, ["--nproc_per_node", "1", worker("dump_env.py")], step_env(SLURM_STEP_NODELIST="node[2-"))
    assert p.returncode == 2 and not dumps
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("launcher: error: Slurm: cannot expand the node list")
    # ... unless the value is given by hand, then the broken variable does not matter
    p, dumps = cli(
        tmp_path,
        ["--nnodes", "1", "--master_addr", "127.0.0.1", "--nproc_per_node", "1", worker("dump_env.py")],
        step_env(SLURM_STEP_NODELIST="node[2-", SLURM_NODEID="0"),
    )
    assert p.returncode == 0, p.stderr


def test_cli_outside_a_step_ignores_slurm(tmp_path):
    env = step_env(SLURM_STEP_ID=None, SLURM_STEP_NODELIST="node[2-")  # a batch shell: not even parsed
    p, dumps = cli(tmp_path, ["--nproc_per_node", "1", worker("dump_env.py")], env)
    assert p.returncode == 0, p.stderr
    assert dumps[0]["env"]["WORLD_SIZE"] == "1"


def test_launch_module_keeps_its_local_rank_default_in_a_step(tmp_path):
    env = step_env(
        SLURM_STEP_NODELIST="localhost",
        SLURM_STEP_NUM_NODES="1",
        SLURM_NTASKS="1",
        SLURM_STEP_NUM_TASKS="1",
        SLURM_NODEID="0",
    )
    dump = tmp_path / "dump"
    dump.mkdir()
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))}
    full.update(env, DUMP_DIR=str(dump), PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, "-m", "launcher.launch", "--nproc_per_node", "1", worker("dump_env.py")],
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads((dump / "0.json").read_text())["argv"] == ["--local-rank=0"]


# ------------------------------------------------------------------------- a real Slurm cluster


@pytest.fixture(scope="module")
def cluster():
    """A two-node Slurm cluster on localhost; torn down afterwards if this fixture started it."""
    reason = cluster_skip_reason()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, SLURM_LOCAL_NODES="2", SLURM_LOCAL_CPUS="4")
    p = subprocess.run(["bash", str(CLUSTER), "start"], capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        pytest.skip(f"could not start Slurm on localhost: {(p.stderr or p.stdout).strip().splitlines()[-3:]}")
    started = "already running with this config" not in p.stderr
    yield
    if started:
        subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def jobs(cluster, tmp_path):
    j = Jobs(tmp_path)
    yield j
    j.cleanup()


def marks(folder: Path) -> dict[int, list[str]]:
    return {int(f.name): f.read_text().split() for f in folder.iterdir()} if folder.exists() else {}


def test_two_node_job_trains_the_example_to_the_end_through_a_usr1_warning(jobs, tmp_path):
    ckpt = tmp_path / "ckpt"
    job = jobs.submit(
        "multi_node.sbatch",
        "examples/train_ddp.py",
        "--epochs",
        "8",
        "--step-time",  # 32 steps an epoch per worker: ~8 s in all, long enough for the warning to land
        "0.03",  # mid-run (~1 s), where 30 epochs of the bare model cost ~9 s of CPU per worker for it
        "--checkpoint-every",
        "100",
        "--checkpoint-dir",
        str(ckpt),
        env={"SLURM_LABELIO": "1"},
    )  # srun -l: "0: " / "1: "
    # The example catches USR1 first thing; wait until rank 0 is training, then warn as Slurm would
    # 90 s before the time limit (--signal=B:USR1@90 signals the batch shell only, as --batch does).
    jobs.until(lambda: "no checkpoint yet" in jobs.log(job), timeout=90, job=job)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, timeout=30)
    info = jobs.wait(job, timeout=90)
    log = jobs.log(job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert info["NodeList"] == "node[1-2]"
    assert "2 workers" in log and "epoch 8/8" in log, log  # one worker per node, one world of two
    assert re.search(r"^0: .*launcher: passing SIGUSR1 to the workers", log, re.M), log  # node1's launcher
    assert re.search(r"^1: .*launcher: passing SIGUSR1 to the workers", log, re.M), log  # node2's launcher
    assert "pre-emption warning (SIGUSR1): checkpointing after epoch" in log, log
    assert "[batch] step ended with exit code 0" in log
    assert (ckpt / "last.pt").exists()
    assert not wait_gone(jobs.token)


def test_usr1_reaches_every_worker_and_the_job_goes_on(jobs, tmp_path):
    folder = tmp_path / "marks"
    folder.mkdir()
    job = jobs.submit("multi_node.sbatch", worker("signals.py"), env={"MARK_DIR": str(folder), "SLEEP": "10"})
    jobs.until(lambda: sorted(marks(folder)) == [0, 1], timeout=60, job=job)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, timeout=30)
    jobs.until(lambda: all("SIGUSR1" in m for m in marks(folder).values()), timeout=20, job=job)
    assert jobs.info(job)["JobState"] == "RUNNING"
    info = jobs.wait(job, timeout=60)
    log = jobs.log(job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    for rank, seen in marks(folder).items():
        # Slurm signals every process of the step and the launcher passes it on: once or twice
        assert seen[0] == "ready" and seen[-1] == "done" and 1 <= seen.count("SIGUSR1") <= 2, (rank, seen)
    assert "forwarding it to the launchers" in log and "requeue" not in log


def test_scancel_ends_the_job_with_no_process_left(jobs, tmp_path):
    folder = tmp_path / "marks"
    folder.mkdir()
    job = jobs.submit("multi_node.sbatch", worker("signals.py"), env={"MARK_DIR": str(folder), "SLEEP": "120"})
    jobs.until(lambda: sorted(marks(folder)) == [0, 1], timeout=60, job=job)
    assert len(procs_with_token(jobs.token)) >= 4  # batch shell, srun, 2 launchers, 2 workers
    subprocess.run(["scancel", job], check=True, timeout=30)
    info = jobs.wait(job, timeout=30)
    assert info["JobState"] == "CANCELLED"
    assert not wait_gone(jobs.token, 15), "processes left after scancel"
    for rank, seen in marks(folder).items():
        # stopped, not just killed; Slurm SIGTERMs every process of the step too, so one more may land
        # while the worker exits
        assert "exit" in seen and "SIGTERM" in seen[: seen.index("exit")], (rank, seen)
        assert set(seen[seen.index("exit") + 1 :]) <= {"SIGTERM"}, (rank, seen)


def test_requeue_on_usr1_runs_the_job_again(jobs, tmp_path):
    folder = tmp_path / "marks"
    folder.mkdir()
    job = jobs.submit(
        "multi_node.sbatch",
        worker("slurm_requeue.py"),  # 60 s, then 0.5 s after the requeue
        env={"MARK_DIR": str(folder), "REQUEUE": "1", "REQUEUE_GRACE": "1"},
    )
    jobs.until(lambda: sorted(marks(folder)) == [0, 1], timeout=60, job=job)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, timeout=30)
    info = jobs.wait(job, states=("PENDING",), timeout=60)
    assert info["Restarts"] == "1"
    # Slurm holds a requeued job back for a while (Reason=BeginTime), in part because a restart in
    # the second its old credential was revoked fails ("Job credential revoked"): once the nodes
    # are idle again, let it start 3 s from now instead of minutes.
    jobs.until(
        lambda: (
            subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=30).stdout.split()
            == ["idle", "idle"]
        ),
        timeout=60,
        job=job,
    )
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now+3"], check=True, timeout=30)
    info = jobs.wait(job, timeout=90)
    log = jobs.log(job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert "(restart 0)" in log and "(restart 1)" in log and "requeueing job" in log, log  # --open-mode=append
    for rank, seen in marks(folder).items():
        # warned, stopped by the requeue, run again to the end
        assert seen.count("ready") == 2, (rank, seen)
        again = seen.index("ready", 1)
        first, second = seen[:again], seen[again:]
        assert first[:2] == ["ready", "SIGUSR1"] and "exit" in first and second == ["ready", "done"], (rank, seen)
        # Slurm SIGTERMs every process of the step as the launcher does: a second one may land while
        # the worker exits, never before it was asked to stop
        stopping = first.index("exit")
        assert "SIGTERM" in first[:stopping] and set(first[stopping + 1 :]) <= {"SIGTERM"}, (rank, seen)


def test_single_node_script(jobs, tmp_path):
    job = jobs.submit("single_node.sbatch", worker("node_info.py"), env={"NPROC_PER_NODE": "2", "SLEEP": "0"})
    info = jobs.wait(job, timeout=60)
    log = jobs.log(job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert "info rank=0 world=2" in log and "info rank=1 world=2" in log, log


def test_etcd_script(jobs, tmp_path):
    etcd = system.which("etcd")
    if etcd is None:
        pytest.skip(system.missing("etcd", "etcd-server"))
    ports = [free_port(), free_port()]
    client, peer = (f"http://127.0.0.1:{p}" for p in ports)
    server = subprocess.Popen(
        [
            etcd,
            "--name",
            "t",
            "--data-dir",
            str(tmp_path / "etcd"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"t={peer}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        job = jobs.submit(
            "etcd.sbatch", worker("node_info.py"), env={"ETCD_ENDPOINT": f"127.0.0.1:{ports[0]}", "SLEEP": "0"}
        )
        info = jobs.wait(job, timeout=90)
        log = jobs.log(job)
        assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
        assert "info rank=0 world=2" in log and "info rank=1 world=2" in log, log
    finally:
        server.terminate()
        server.wait(10)


def test_etcd_script_needs_an_endpoint(jobs):
    job = jobs.submit("etcd.sbatch", worker("node_info.py"))
    info = jobs.wait(job, timeout=30)
    assert info["JobState"] == "FAILED" and "set ETCD_ENDPOINT=host:port" in jobs.log(job)


# ------------------------------------------------- the sbatch scripts follow the launchers' exit codes


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
