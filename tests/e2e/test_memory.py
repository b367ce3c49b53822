"""The kept state in memory (docs/memory.md): a restart of the group resumes at the last step every rank
copied, not at step 0, and its final weights equal an undisturbed run's bit for bit; the copies go with
the agent's folder in /dev/shm however the job ends.

tests/workers/in_place_exact.py (3 ranks of DDP with Dropout and BatchNorm over a DataLoader with a
DistributedSampler, per-rank streams seeded per epoch, a logged loss all_reduce after the optimizer
step) logs the steps each process applied and their sample ids. Its workers are forked from the
--preload zygote (the suite's time).
"""

from __future__ import annotations

import collections
import glob
import os
import re
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.launcher_runs import Agent, Cluster, Launch, c10d, wait_line
from support.paths import WORKERS
from support.ports import free_port
from support.processes import procs_with_token, wait_for
from support.step_logs import read_step_logs

STEPS = 24  # 2 epochs of 12 batches per rank
WORLD = 3
WORKER = str(WORKERS / "in_place_exact.py")
pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")


@dataclass(frozen=True)
class Outcome:
    """What one run computed, read from its step logs."""

    returncode: int
    finals: dict[int, set[tuple[int, str, str]]]  # rank -> {(steps, weights, buffers)} of its final processes
    applied: dict[int, list[int]]  # rank -> the steps its processes applied, in all
    ids: collections.Counter  # sample id -> how many times a step applied it, over the ranks
    err: str


def left(run_id: str) -> list[str]:
    return glob.glob(f"/dev/shm/launcher-{run_id}-*")


def run(tmp: Path, recovery: str = "restart", *more: str, nproc: int = WORLD, **env: str) -> Outcome:
    logs = tmp / "steps"
    logs.mkdir(parents=True)
    run_id = f"mem{uuid.uuid4().hex[:8]}"
    launch = Launch(preload=True)
    try:
        r = launch.run(
            "--nproc_per_node", str(nproc), "--recovery", recovery, "--max_restarts", "2", "--rdzv_id", run_id,
            "--no-live", *more, WORKER, env={"STEP_LOG": str(logs), **env}, timeout=170,
        )  # fmt: skip
    finally:
        launch.cleanup()
    assert left(run_id) == [], "the agent's folder in memory was left behind"
    finals, applied, ids = read_step_logs(logs)
    return Outcome(r.returncode, finals, applied, ids, r.stdout + r.stderr)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> Outcome:
    """The job run with no fault: what every restarted run must end with (and no folder left: a success)."""
    ref = run(tmp_path_factory.mktemp("undisturbed"))
    assert ref.returncode == 0 and "resumed at step" not in ref.err, ref.err
    assert len(re.findall(r"the kept state is copied to memory at each step's end: \S+ \S+ a copy", ref.err)) == 1
    assert "the step waits for the copy from now on" not in ref.err, ref.err  # each copy went beside a step
    return ref


def assert_resumed(got: Outcome, ref: Outcome, at: int) -> None:
    """The job restarted at step `at` on every rank, ran again at most one step per rank, and ended exact."""
    assert got.returncode == 0, got.err
    assert got.err.count(f"resumed at step {at} from its copy in memory") == WORLD, got.err
    assert got.finals == ref.finals, f"the weights differ from the undisturbed run's\n{got.err}"
    for rank, steps in got.applied.items():  # the first processes' steps and their successors', together
        again = len(steps) - STEPS
        assert sorted(set(steps)) == list(range(STEPS)) and again <= 1, f"rank {rank} applied {sorted(steps)}"
    assert set(got.ids) == set(ref.ids)


@pytest.mark.timeout(300)
def test_a_death_after_the_optimizer_step_restarts_the_group_at_the_last_step(tmp_path, undisturbed):
    """Rank 1 dies after step 5's optimizer step, before the loss all_reduce: every rank's newest whole
    copy is step 4's end (5 steps done); step 5 runs again, once, and nothing else does."""
    got = run(tmp_path, DIE_AT="1 5 after", RESUMES="1")
    assert_resumed(got, undisturbed, 5)
    # told before any load: the first round's processes start fresh, the restarted ones from memory
    said = re.findall(r"resumes from memory: (\w+)", got.err)
    assert sorted(said) == ["False"] * WORLD + ["True"] * WORLD, got.err
    assert got.applied[1].count(5) == 2, got.applied  # rank 1 applied step 5 before it died, and again


@pytest.mark.timeout(300)
def test_local_rank_0s_death_restarts_the_group_from_the_replicas_it_copied(tmp_path, undisturbed):
    """Rank 0, the node's local rank 0, the one that copies the replicas (the parameters and momentum), dies
    after step 5's optimizer step: ranks 1 and 2 resume from their own parts and its copy of step 5, exact."""
    got = run(tmp_path, DIE_AT="0 5 after")
    assert "two per node (the replicas' state once for the node's 3 ranks; " in got.err, got.err
    assert_resumed(got, undisturbed, 5)
    assert got.applied[0].count(5) == 2, got.applied


@pytest.mark.timeout(300)
def test_a_declined_in_place_recovery_resumes_from_memory(tmp_path, undisturbed):
    """In place, a peer lost outside `with step:` (an eval's all_reduce at epoch 0's end) restarts the group:
    it resumes at the epoch's end (12 steps done), not at step 0."""
    got = run(tmp_path, "in-place", DIE_AT="1 0 eval")
    assert "a peer was lost outside `with step:`" in got.err, got.err
    assert_resumed(got, undisturbed, 12)
    assert sum(len(s) for s in got.applied.values()) == WORLD * STEPS, got.applied  # no step again


@pytest.mark.timeout(300)
def test_a_hang_restarts_the_group_at_the_last_step(tmp_path, undisturbed):
    """Rank 1 hangs in step 7 and its peers wait on it: --hang_timeout restarts the group, at step 7."""
    got = run(tmp_path, "restart", "--hang_timeout", "3", DIE_AT="1 7 hang")
    assert "hung: no progress for 3 s" in got.err, got.err
    assert_resumed(got, undisturbed, 7)


@pytest.mark.timeout(120)
def test_a_failed_job_leaves_nothing_in_memory(tmp_path):
    got = run(tmp_path, "restart", "--max_restarts", "0", DIE_AT="1 5 after")  # `run` checks /dev/shm
    assert got.returncode != 0 and "resumed at step" not in got.err, got.err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_copies_go_when_the_agent_is_stopped(tmp_path, sig):
    run_id = f"mem{uuid.uuid4().hex[:8]}"
    (tmp_path / "steps").mkdir()
    launch = Launch(preload=True)
    try:
        agent = launch.start(
            "--nproc_per_node", "2", "--rdzv_id", run_id, "--no-live", WORKER,
            env={"STEP_LOG": str(tmp_path / "steps"), "HOLD_AT": "3", "WIDTH": "2048"},
        )  # fmt: skip
        seen = ""
        while seen.count("holding rank=") < 2:
            seen += wait_line(agent, "holding rank=", timeout=90)
        (folder,) = left(run_id)
        copies = sorted(os.listdir(folder))
        assert {"state.0.0", "state.0.1", "state.1.0", "state.1.1"} <= set(copies), copies  # two per rank
        # The DDP's replicas once for the node: in local rank 0's copies (the parameters and their momentum,
        # 2 x 90 kB), not in rank 1's (its own batch-norm statistics, streams and record).
        sizes = {name: os.path.getsize(os.path.join(folder, name)) for name in copies}
        replicas = 2 * 4 * (8 * 2048 + 2048 + 2048 * 3 + 3)
        assert min(sizes["state.0.0"], sizes["state.0.1"]) > replicas, sizes
        assert max(sizes["state.1.0"], sizes["state.1.1"]) < replicas / 3, sizes
        agent.send_signal(sig)
        agent.wait(30)
        wait_for(lambda: left(run_id) == [], 10, "the folder removed")  # by the guard after a SIGKILL
    finally:
        launch.cleanup()


@pytest.mark.timeout(300)
def test_a_node_lost_whole_resumes_exactly_from_the_other_nodes_copies(tmp_path):
    """Two nodes of 2 workers (tests/workers/in_place_exact.py: per-rank dropout streams and batch-norm
    buffers) and a spare, under --recovery restart, with a store of their own. The node without group
    rank 0 is SIGKILLed whole in the first epoch: its copies go with its agent, its ranks' own records
    (streams and buffers by step) stay in the store. The group restarts on the other node and the spare:
    the survivor's ranks load their copies, the spare's receive the state from them and take up their own
    streams and buffers from the store, said in one line each. Every rank ends with the weights and buffers
    of an undisturbed run of 4 ranks."""
    ref = run(tmp_path / "undisturbed", nproc=4)
    assert ref.returncode == 0, ref.err
    logs = tmp_path / "steps"
    logs.mkdir()
    port = free_port()
    cluster = Cluster(preload=True)
    cluster.store("127.0.0.1", port)
    flags = c10d(port, "2", nproc=2, run_id=f"mem{uuid.uuid4().hex[:8]}", conf="is_host=false")

    def node(name: str) -> Agent:
        return cluster.start(
            *flags, "--recovery", "restart", "--max_restarts", "2", "--no-live", "--shutdown_timeout", "5",
            "--events_file", str(tmp_path / f"{name}.events"), WORKER, name=name,
            env={"STEP_LOG": str(logs), "STEP_TIME": "0.2"},
        )  # fmt: skip

    def running(name: str) -> bool:
        events = tmp_path / f"{name}.events"
        return events.exists() and '"event": "running"' in events.read_text()

    def applied(rank: int) -> tuple[int, int]:
        """(the pid of the rank's first process, the steps it applied), once it applied any."""
        for f in logs.glob(f"{rank}.*"):
            return int(f.name.split(".")[1]), f.read_text().count("applied ")
        return 0, 0

    try:
        a, b = node("a"), node("b")
        wait_for(lambda: running("a") and running("b"), 90, "both nodes running")
        spare = node("spare")  # once the group is full: it waits
        spare.wait_for(r"waiting as a spare", stream="err", timeout=90)
        wait_for(lambda: applied(0)[1] >= 5, 120, "rank 0 at step 5")
        head = a if applied(0)[0] in procs_with_token(a.token) else b
        lost = b if head is a else a
        lost.signal(signal.SIGKILL)
        lost.wait(30)
        codes = {n.name: n.wait(150) for n in (head, spare)}
        out = head.stdout + head.stderr + spare.stdout + spare.stderr
        assert set(codes.values()) == {0}, f"{head.stderr[-3000:]}\n{spare.stderr[-3000:]}"
        own = re.findall(r"resumed at step (\d+) from its copy in memory", head.stderr)
        sent = re.findall(r"resumed at step (\d+) from rank \d+'s copy in memory \(this rank holds none\), with "
                          r"its own random streams and buffers from the launcher's store", spare.stderr)  # fmt: skip
        # where rank 0 was (5 steps done at least), a step back at most
        assert len(own) == len(sent) == 2 and len(set(own + sent)) == 1 and int(own[0]) >= 4, out[-4000:]
        assert "the group starts from the script's own state" not in out, out[-4000:]
        finals, _, _ = read_step_logs(logs)
        assert finals == ref.finals, f"the weights differ from the undisturbed run's\n{out[-4000:]}"
    finally:
        cluster.cleanup()
