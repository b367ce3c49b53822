"""Spares on c10d (issue 22): real launcher agents on loopback, a fixed-size job (--nnodes 2, or 3 while a
round forms), one node lost at a time. A spare takes the lost node's group rank, the world size never
changes, the restart is charged once; with no spare a replacement is waited for, within a bound; a spare
ends with the job's verdict. The scenarios are written once here and run on etcd by test_spares_etcd.py.

Every agent gets its own TEST_TOKEN and events file; the worker (tests/workers/spare_steps.py) waits
before its last step until the test opens the gate, so the test decides when the job may end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from support.launcher_runs import Agent as Launched
from support.ports import free_port
from support.processes import procs_with_token, wait_for

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "workers" / "spare_steps.py")
STEPS = 20


# ---------------------------------------------------------------------------- helpers (this file's own)


class Agent(Launched):
    """One launcher agent of the job (support's Agent), with its events file parsed on demand."""

    def __init__(self, name: str, cmd: list[str], env: dict, events: Path, token: str):
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        super().__init__(popen, token, name)
        self.events_path = events

    def events(self, kind: str | None = None) -> list[dict]:
        try:
            lines = self.events_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        parsed = [json.loads(line) for line in lines if line.endswith("}")]
        return [e for e in parsed if kind is None or e["event"] == kind]

    def running(self) -> list[dict]:
        return self.events("running")

    def line(self, pattern: str, timeout: float = 60) -> re.Match:
        """The first line of its stderr (the launcher's own lines) matching `pattern`."""
        return self.wait_for(pattern, timeout, stream="err")

    def wait(self, timeout: float = 90) -> int:
        return super().wait(timeout)


class Job:
    """The agents of one fixed-size job on one rendezvous (`rdzv`: the backend's flags), each with its
    own TEST_TOKEN and events file; every process left is killed at teardown."""

    def __init__(
        self,
        tmp: Path,
        rdzv: list[str],
        nnodes: str = "2",
        max_restarts: int = 3,
        conf: str = "",
        env: dict | None = None,
    ):
        self.tmp, self.rdzv, self.nnodes, self.max_restarts = tmp, rdzv, nnodes, max_restarts
        self.env = env or {}
        self.conf = ",".join(filter(None, ["last_call_timeout=1", conf]))
        self.agents: list[Agent] = []
        self.ckpt = tmp / "ckpt"
        self.ckpt.mkdir(exist_ok=True)
        self.gate = tmp / "gate"
        self.others: list[subprocess.Popen] = []  # a standalone store, for instance

    def start(self, name: str, conf: str = "", env: dict | None = None) -> Agent:
        token = uuid.uuid4().hex
        full = dict(os.environ, TEST_TOKEN=token, PYTHONPATH=str(ROOT), CKPT_DIR=str(self.ckpt))
        full.update(STEPS=str(STEPS), GATE=str(self.gate))
        for var in ("PYTEST_CURRENT_TEST", "PET_PRELOAD"):
            full.pop(var, None)
        full.update({**self.env, **(env or {})})
        events = self.tmp / f"{name}.events"
        cmd = [
            sys.executable,
            "-m",
            "launcher",
            "--nnodes",
            self.nnodes,
            "--nproc_per_node",
            "1",
            "--max_restarts",
            str(self.max_restarts),
            "--rdzv_id",
            "spares",
            "--rdzv_conf",
            ",".join(filter(None, [self.conf, conf])),
            "--events_file",
            str(events),
            "--no-live",
            "--shutdown_timeout",
            "5",
            *self.rdzv,
            WORKER,
        ]
        agent = Agent(name, cmd, full, events, token)
        self.agents.append(agent)
        return agent

    def wait_serving(self, first: Agent | None) -> None:
        """Until the rendezvous store answers (a backend whose first agent hosts it says how)."""

    def alive_keys(self, r: int, tickets: int) -> int:
        """How many of round r's tickets 1..tickets have their alive key held in the store now."""
        raise NotImplementedError

    def open_gate(self) -> None:
        self.gate.write_text("go")

    def step(self) -> int:
        return json.loads((self.ckpt / "ckpt.json").read_text())["step"]

    def cleanup(self) -> None:
        for a in self.agents:
            if os.environ.get("SPARES_DEBUG"):
                print(f"\n===== {a.name} rc={a.popen.poll()}\n{a.stderr[-6000:]}")
            for pid in [a.pid, *procs_with_token(a.token)]:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            try:
                a.popen.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for p in self.others:
            p.kill()
            p.wait(5)

    def leftovers(self, timeout: float = 15) -> dict[str, list[int]]:
        deadline, left = time.monotonic() + timeout, {}
        for a in self.agents:
            while (alive := procs_with_token(a.token)) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive:
                left[a.name] = alive
        return left


def running_in(agent: Agent, count: int = 1, timeout: float = 60) -> dict:
    """The agent's `count`-th running event (its workers of that round started)."""
    return wait_for(
        lambda: len(agent.running()) >= count and agent.running()[count - 1], timeout, f"{agent.name} running"
    )


def members_then_spare(job: Job, first_conf: str = "") -> tuple[Agent, Agent, Agent]:
    """Two members running (the first started first: on agent-hosted c10d it hosts the store), then a
    spare that says so."""
    a = job.start("a", conf=first_conf)
    job.wait_serving(a)
    b = job.start("b")
    running_in(a)
    running_in(b)
    spare = job.start("spare")
    spare.line(r"waiting as a spare")
    return a, b, spare


def assert_took_over(job: Job, survivor: Agent, spare: Agent, lost_group: int, restarts: int = 1) -> None:
    """The survivor and the spare finished; the spare holds the lost group rank; every round ran at world
    size 2; the survivor kept its group rank; `restarts` charged; the checkpoint reached the end."""
    job.open_gate()
    codes = {a.name: a.wait() for a in (survivor, spare)}
    assert codes == {survivor.name: 0, spare.name: 0}, "\n\n".join(a.stderr[-3000:] for a in (survivor, spare))
    taken = spare.running()
    assert len(taken) == 1 and taken[0]["group_rank"] == lost_group, taken
    kept = survivor.running()
    assert len(kept) == 2 and len({e["group_rank"] for e in kept}) == 1, kept
    assert {e["world_size"] for e in kept + taken} == {2} and {e["group_world_size"] for e in kept + taken} == {2}
    assert kept[-1]["restarts"] == taken[0]["restarts"] == restarts, (kept, taken)
    for a in (survivor, spare):
        assert a.events("finished")[-1]["restarts"] == restarts, a.events("finished")
    assert job.step() == STEPS
    assert not job.leftovers()


# ---------------------------------------------------------------------------- scenarios (c10d and etcd)


def member_lost_spare_takes_over(job: Job, sig: int, lose_group: int | None = None) -> None:
    """A member (group rank `lose_group`; on agent-hosted c10d, the one that does not host) is stopped
    by `sig`; the spare takes its group rank in the next round, one restart charged."""
    a, b, spare = members_then_spare(job)
    if lose_group is None:
        victim, survivor = b, a
    else:
        victim, survivor = (a, b) if a.running()[0]["group_rank"] == lose_group else (b, a)
    lost_group = victim.running()[0]["group_rank"]
    victim.signal(sig)
    if sig == signal.SIGTERM:
        assert victim.wait() == 128 + signal.SIGTERM
        survivor.line(r"membership changed \(.* left: stopped by SIGTERM\)")
    else:
        victim.wait()
        survivor.line(rf"membership changed \(node with group rank {lost_group} (died|lost its lease)")
    running_in(spare)
    assert_took_over(job, survivor, spare, lost_group)


def node_lost_while_round_forms(job: Job, sig: int) -> None:
    """--nnodes 3: two nodes wait for the third; the second is stopped by `sig`; then two more come.
    The dead (or departed) node never enters the round: it forms at once with the three live ones,
    no restart charged, every node exits 0."""
    a = job.start("a")
    job.wait_serving(a)
    b = job.start("b")
    a.line(r"waiting for nodes in round 0: 2 joined \(min 3, max 3\)")
    b.signal(sig)
    if sig == signal.SIGTERM:
        assert b.wait() == 128 + signal.SIGTERM
        b.line(r"left round 0 while it formed \(stopped by SIGTERM\)")
    else:
        b.wait()
    # Lost means the store knows it: its alive key is gone (c10d: 0.1 s after its connections closed;
    # etcd: when its lease expires, 2 s).
    wait_for(lambda: job.alive_keys(0, 2) == 1, 30, "the lost node's alive key to go")
    c, d = job.start("c"), job.start("d")
    job.open_gate()
    codes = {x.name: x.wait() for x in (a, c, d)}
    assert codes == {"a": 0, "c": 0, "d": 0}, "\n\n".join(x.stderr[-3000:] for x in (a, c, d))
    runs = [e for x in (a, c, d) for e in x.running()]
    assert len(runs) == 3 and {e["world_size"] for e in runs} == {3}, runs
    assert sorted(e["group_rank"] for e in runs) == [0, 1, 2] and {e["restarts"] for e in runs} == {0}, runs
    assert not b.running()
    assert not job.leftovers()


def replacement_within_bound(job: Job) -> None:
    """No spare: the survivor waits for a node to fill the lost group rank, saying so; one started by hand
    within the bound is admitted and the job finishes."""
    a = job.start("a")
    job.wait_serving(a)
    b = job.start("b")
    running_in(a)
    lost = running_in(b)["group_rank"]
    b.signal(signal.SIGKILL)
    b.wait()
    a.line(rf"waiting for a node to fill group rank {lost} in round \d+ \(node with group rank {lost} ")
    c = job.start("c")
    running_in(c)
    assert_took_over(job, a, c, lost)


def replacement_past_bound(job: Job) -> None:
    """No spare and none comes within replace_timeout: the survivor ends with that reason, exit 75."""
    a = job.start("a", conf="replace_timeout=2")
    job.wait_serving(a)
    b = job.start("b", conf="replace_timeout=2")
    running_in(a)
    lost = running_in(b)["group_rank"]
    b.signal(signal.SIGTERM)
    assert b.wait() == 128 + signal.SIGTERM
    assert a.wait() == 75, a.stderr  # nodes were lost and none came: "requeue me" (docs/policy.md)
    a.line(
        rf"reason: .*no node came to fill group rank {lost} within 2 s \(replace_timeout\)"
        r" after .* left: stopped by SIGTERM"
    )
    assert not job.leftovers()


def spares_share_the_verdict(job: Job, status: Callable[[], dict] | None) -> None:
    """Two spares: both listed by `launcher status`; one SIGKILLed is named by the node with group rank 0
    and dropped; the job succeeds and the other spare exits 0, saying the job finished without it."""
    a, b, s1 = members_then_spare(job)
    s2 = job.start("spare2")
    s2.line(r"waiting as a spare")
    if status is not None:
        listed = wait_for(lambda: len(status().get("spares", [])) == 2 and status()["spares"], 30, "two spares listed")
        assert {s["node"].rsplit(":", 1)[1] for s in listed} == {str(s1.pid), str(s2.pid)}, listed
    assert s1.events("waiting")[0]["what"] == "spare"
    s1.signal(signal.SIGKILL)
    s1.wait()
    head = a if a.running()[0]["group_rank"] == 0 else b
    head.line(rf"spare \S+:{s1.pid} died; dropped", timeout=30)
    wait_for(lambda: any(e["node"].endswith(f":{s1.pid}") for e in head.events("spare_lost")), 10, "spare_lost")
    if status is not None:
        wait_for(lambda: len(status().get("spares", [])) == 1, 30, "one spare listed")
    job.open_gate()
    codes = {x.name: x.wait() for x in (a, b, s2)}
    assert codes == {"a": 0, "b": 0, "spare2": 0}, "\n\n".join(x.stderr[-3000:] for x in (a, b, s2))
    s2.line(r"the job finished without this spare")
    assert not s2.running() and not job.leftovers()


def spare_of_a_failed_job(job: Job) -> None:
    """--max_restarts 0 and rank 0 exits 5: every node, the spare included, exits 5 and names rank 0's
    failure as the root cause (the spare's remote), never a store error."""
    a, b, spare = members_then_spare(job)
    job.open_gate()
    codes = {x.name: x.wait() for x in (a, b, spare)}
    assert codes == {"a": 5, "b": 5, "spare": 5}, "\n\n".join(x.stderr[-3000:] for x in (a, b, spare))
    spare.line(r"root cause \(remote, node \S+\): rank 0 \(local rank 0\) on \S+ exited with code 5")
    assert "closed the connection" not in spare.stderr and "store failed" not in spare.stderr, spare.stderr
    assert not job.leftovers()


# ---------------------------------------------------------------------------- c10d


class C10dJob(Job):
    """A job whose first agent hosts the store (its address is the endpoint's)."""

    def __init__(self, tmp: Path, **kw):
        self.port = free_port()
        super().__init__(tmp, ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{self.port}"], **kw)

    def wait_serving(self, first: Agent | None) -> None:
        """Until the first agent listens on the endpoint: the next agents are its clients."""

        def listening() -> bool:
            assert first is None or first.popen.poll() is None, first.stderr
            return _connects(self.port)

        wait_for(listening, 30, "the store to listen")

    def alive_keys(self, r: int, tickets: int) -> int:
        from launcher.rendezvous.c10d import TCPStoreAdapter

        store = TCPStoreAdapter("127.0.0.1", self.port, 5.0)
        try:
            return sum(bool(v) for v in store.multi_get([f"spares/r{r}/alive{k}" for k in range(1, tickets + 1)]))
        finally:
            store.close()

    def status(self) -> dict:
        r = subprocess.run(
            [sys.executable, "-m", "launcher", "status", "--rdzv_backend", "c10d"]
            + ["--rdzv_endpoint", f"127.0.0.1:{self.port}", "--rdzv_id", "spares", "--json"],
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


class StandaloneJob(C10dJob):
    """A job on `python -m launcher store`: no training node hosts the rendezvous store."""

    def __init__(self, tmp: Path, **kw):
        super().__init__(tmp, **kw)
        self.conf += ",is_host=false"
        store = subprocess.Popen(
            [sys.executable, "-m", "launcher", "store", "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        self.others.append(store)

    def wait_serving(self, first: Agent | None) -> None:
        wait_for(lambda: _connects(self.port), 30, "the standalone store to listen")


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def job(tmp_path):
    j = C10dJob(tmp_path)
    yield j
    j.cleanup()


@pytest.fixture
def standalone(tmp_path):
    j = StandaloneJob(tmp_path)
    yield j
    j.cleanup()


@pytest.mark.timeout(180)
def test_member_sigkilled_spare_takes_its_group_rank(job):
    member_lost_spare_takes_over(job, signal.SIGKILL)


@pytest.mark.timeout(180)
def test_member_sigtermed_spare_takes_its_group_rank(job):
    member_lost_spare_takes_over(job, signal.SIGTERM)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_node_lost_while_the_round_forms_never_enters_it(tmp_path, sig):
    j = C10dJob(tmp_path, nnodes="3")
    try:
        node_lost_while_round_forms(j, sig)
    finally:
        j.cleanup()


@pytest.mark.timeout(180)
def test_group_rank_0_lost_on_launcher_store_a_spare_takes_it(standalone):
    standalone.wait_serving(None)
    member_lost_spare_takes_over(standalone, signal.SIGKILL, lose_group=0)


@pytest.mark.timeout(180)
def test_no_spare_a_replacement_within_the_bound_is_admitted(job):
    replacement_within_bound(job)


@pytest.mark.timeout(180)
def test_no_spare_past_the_bound_the_reason_is_named(job):
    replacement_past_bound(job)


@pytest.mark.timeout(180)
def test_spares_are_listed_judged_and_exit_with_the_jobs_success(job):
    spares_share_the_verdict(job, job.status)


@pytest.mark.timeout(180)
def test_a_spare_of_a_failed_job_exits_with_its_verdict(tmp_path):
    j = C10dJob(tmp_path, max_restarts=0, env={"FAIL_AT": f"0:{STEPS}"})
    try:
        spare_of_a_failed_job(j)
    finally:
        j.cleanup()
