"""Slurm: topology defaults from SLURM_* (pure, then through the CLI), and the sbatch scripts in
scripts/slurm/ on a real two-node Slurm cluster on localhost (tests/slurm_cluster.sh: one
slurmctld, two slurmd "nodes" node1/node2, munged; set up once for the module, torn down after).

The cluster part needs root (daemons, /etc/hosts entries for node1/node2) and the Debian Slurm
packages (scripts/setup.sh installs them); it is skipped, with the reason, where it cannot run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support.paths import LAUNCHER, ROOT, worker
from support.processes import kill_leftovers, procs_with_token, wait_gone

from launcher import slurm
from launcher.errors import ConfigError

# The first cluster test may include installing Slurm (when scripts/setup.sh could not) in its set-up.
pytestmark = pytest.mark.timeout(300)
SCRIPTS = ROOT / "scripts" / "slurm"
CLUSTER = ROOT / "tests" / "slurm_cluster.sh"


# ------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node[01-03,07],gpu-a[1-2]", ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]),
        ("n[001-004]", ["n001", "n002", "n003", "n004"]),
        ("a[1-2],b[7]", ["a1", "a2", "b7"]),
        ("alpha,beta,gamma", ["alpha", "beta", "gamma"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("host-1.example.com", ["host-1.example.com"]),
        ("node[3,1]", ["node3", "node1"]),  # Slurm's order is kept: the first host is SLURM_NODEID 0
    ],
)
def test_expand_nodelist(text, hosts):
    assert slurm.expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-", "x[3-1]", "", "  ", "a]b"])
def test_expand_bad_nodelist_is_loud(text):
    with pytest.raises(ConfigError, match="node list"):
        slurm.expand_nodelist(text)


def test_scontrol_is_the_fallback_without_python_hostlist(monkeypatch):
    monkeypatch.setitem(sys.modules, "hostlist", None)  # import hostlist -> ImportError
    assert slurm.expand_nodelist("node[1-2]", scontrol=lambda t: ["node1", "node2"]) == ["node1", "node2"]
    # scontrol answers `node[1-` with `node]` and exit 0: that garbage is refused, not used
    with pytest.raises(ConfigError, match=r"scontrol show hostnames gave node\]"):
        slurm.expand_nodelist("node[1-", scontrol=lambda t: ["node]"])

    def missing(text):
        raise ConfigError("scontrol is not on PATH")

    with pytest.raises(ConfigError, match="python-hostlist is not installed and scontrol is not on PATH"):
        slurm.expand_nodelist("node[1-2]", scontrol=missing)


def test_master_port_is_deterministic_and_below_the_ephemeral_range():
    assert slurm.master_port("12345") == slurm.master_port(12345) == 20000 + 12345 % 9000
    ports = {slurm.master_port(j) for j in range(0, 50000, 7)}
    assert min(ports) >= 20000 and max(ports) < 29000  # below 29400/29500 and 32768
    with pytest.raises(ConfigError, match="SLURM_JOB_ID"):
        slurm.master_port("12_3")


def resolved(d: dict) -> dict:
    """Call the Unresolved entries: their ConfigError is what click would raise."""
    out = {}
    for k, v in d.items():
        try:
            out[k] = v() if callable(v) else v
        except ConfigError as e:
            out[k] = f"ERROR {e}"
    return out


def step_env(**kw) -> dict:
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


def test_step_variables_win_over_the_jobs():
    # A step on node[2-3] of a node[1-3] job (as srun -N2 -r1 gives it): SLURM_NODEID is relative
    # to the step, and the job's first host (node1) is not in the step at all.
    assert slurm.defaults(step_env()) == {
        "nnodes": "2",
        "node_rank": "1",
        "master_addr": "node2",
        "master_port": str(20000 + 4242 % 9000),
    }


def test_job_variables_without_a_step():
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "gpu-a[07-08]",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "16",
    }  # NTASKS of the job, not of a step: not checked
    assert slurm.defaults(env) == {"nnodes": "2", "node_rank": "0", "master_addr": "gpu-a07", "master_port": "20077"}
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_NODELIST": "a,b", "SLURM_NODEID": "1"}
    assert slurm.defaults(env)["master_addr"] == "a"


def test_one_node_leaves_the_port_to_the_launcher():
    d = slurm.defaults(
        step_env(
            SLURM_STEP_NODELIST="node3",
            SLURM_STEP_NUM_NODES="1",
            SLURM_NTASKS="1",
            SLURM_STEP_NUM_TASKS="1",
            SLURM_NODEID="0",
        )
    )
    assert d == {"nnodes": "1", "node_rank": "0", "master_addr": "node3"}  # no master_port: a free one


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4"}, "nnodes", "runs 4 tasks on 2 nodes"),
        ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4"}, "node_rank", None),  # rank itself is fine
        ({"SLURM_NODEID": "2"}, "node_rank", "SLURM_NODEID=2 is out of range for SLURM_STEP_NUM_NODES=2"),
        ({"SLURM_NODEID": None}, "node_rank", "SLURM_NODEID is not set"),
        ({"SLURM_NODEID": "x"}, "node_rank", "is not a node index"),
        ({"SLURM_STEP_NUM_NODES": "two"}, "nnodes", "SLURM_STEP_NUM_NODES='two' is not a number"),
        ({"SLURM_STEP_NUM_NODES": "0"}, "nnodes", "must be at least 1"),
        ({"SLURM_STEP_NODELIST": "node[2-"}, "master_addr", "cannot expand the node list 'node\\[2-'"),
        ({"SLURM_STEP_NODELIST": "node[1-3]"}, "master_addr", "has 3 hosts but SLURM_STEP_NUM_NODES=2"),
        # step count without the step's list: never mix in the job's list (its first host is node1)
        ({"SLURM_STEP_NODELIST": None}, "master_addr", "SLURM_STEP_NODELIST is not set"),
        ({"SLURM_STEP_NUM_NODES": None}, "nnodes", "SLURM_STEP_NUM_NODES is not set"),
        ({"SLURM_JOB_ID": None}, "master_port", "SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_ID": "abc"}, "master_port", "SLURM_JOB_ID='abc' is not a number"),
    ],
)
def test_unresolvable_topology_is_a_loud_error(change, key, message):
    d = slurm.defaults(step_env(**change))
    value = resolved(d)[key]
    if message is None:
        assert not str(value).startswith("ERROR")
        return
    assert str(value).startswith("ERROR Slurm: ") and re.search(message, value), value
    assert "pass --" in value or "--ntasks-per-node=1" in value  # every message names the fix
    assert "\n" not in value
    assert "127.0.0.1" not in json.dumps(resolved(d)) and "localhost" not in json.dumps(resolved(d))


def test_in_step():
    assert slurm.in_step(step_env())
    assert not slurm.in_step(step_env(SLURM_STEP_ID=None))  # the batch script, salloc's shell
    assert not slurm.in_step(step_env(SLURM_JOB_ID=None))
    assert not slurm.in_step({})
    assert not slurm.in_step(step_env(LAUNCHER_SLURM="0"))  # the way out


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


def _cluster_skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "Slurm on localhost needs Linux"
    if os.geteuid() != 0:
        return "starting munged/slurmctld/slurmd and naming node1/node2 in /etc/hosts needs root"
    if not shutil.which("apt-get") and not (shutil.which("slurmctld") and shutil.which("slurmd")):
        return "no Slurm daemons (slurmctld, slurmd) and no apt-get to install them"
    return None


@pytest.fixture(scope="module")
def cluster():
    """A two-node Slurm cluster on localhost; torn down afterwards if this fixture started it."""
    reason = _cluster_skip_reason()
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
        "60",
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
    assert "2 workers" in log and "epoch 60/60" in log, log  # one worker per node, one world of two
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
        assert "SIGTERM" in seen and seen[-1] == "exit", (rank, seen)  # stopped, not just killed


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
        assert seen[:2] == ["ready", "SIGUSR1"] and seen[-3:] == ["exit", "ready", "done"], (rank, seen)


def test_single_node_script(jobs, tmp_path):
    job = jobs.submit("single_node.sbatch", worker("node_info.py"), env={"NPROC_PER_NODE": "2", "SLEEP": "0"})
    info = jobs.wait(job, timeout=60)
    log = jobs.log(job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert "info rank=0 world=2" in log and "info rank=1 world=2" in log, log


def test_etcd_script(jobs, tmp_path):
    etcd = shutil.which("etcd")
    if etcd is None:
        pytest.skip("no etcd binary on PATH (Debian: etcd-server)")
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
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
