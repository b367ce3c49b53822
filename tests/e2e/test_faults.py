"""Fault injection on real multi-node jobs: several launcher agents (on loopback, or in network
namespaces as separate hosts), one fault at a time, and what must follow: a restart, a new round,
or a clean failure with the right exit code, in bounded time; nothing left running; logs and
checkpoints intact. docs/faults.md has the table of faults, outcomes and the tests below.

Every agent gets its own TEST_TOKEN, so one agent's processes can be told from another's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest
from support.faults import (
    ROOTED,
    STEPS,
    assert_rounds_consistent,
    c10d,
    checkpoint,
    starts,
    steps_env,
    wait_checkpoint,
)
from support.launcher_runs import assert_one_story
from support.paths import worker
from support.ports import free_port
from support.processes import sh

# ---------------------------------------------------------------------------- workers


def test_worker_sigkill_restarts_every_node_once(cluster, tmp_path):
    port = free_port()
    env = steps_env(tmp_path, steps=100)  # room for the kill to land before the end on a busy host
    agents = [cluster.start(*c10d(port, "2", "--max_restarts", "2", nproc=2), STEPS, env=env) for _ in range(2)]
    # Both of node 1's workers are stepping and the checkpoint is past step 5. Not "node 1 printed step 5":
    # the workers do not wait for each other, and a node whose zygote forks late on a busy host starts
    # from the checkpoint rank 0 has already moved on (from=11 in a CI run), so it never prints step 5.
    for a in agents:  # every worker started (a node forked late has not, when its peer's steps are far on)
        a.wait_for(r"start rank=\d world=4 restart=0\b", count=2)
    agents[1].wait_for(r"step rank=\d n=\d+", count=2)
    wait_checkpoint(tmp_path, 5, timeout=90)
    victim = agents[1].workers()[0]
    os.kill(victim, signal.SIGKILL)
    rcs = [a.wait(90) for a in agents]
    assert rcs == [0, 0], [a.stderr[-2000:] for a in agents]
    for a in agents:  # one restart, charged once for the whole job, seen alike on both nodes
        assert [s["restart"] for s in starts(a)] == ["0", "0", "1", "1"], a.stdout
        assert int(starts(a)[-1]["from"]) > 0  # the second attempt resumed from the checkpoint
    assert f"pid {victim}" in agents[1].stderr or "killed by SIGKILL" in agents[1].stderr, agents[1].stderr
    # the other node says which rank failed where, not that the membership changed
    agents[0].wait_for(
        rf"launcher: a worker failed on another node: rank \d \(local rank [01]\) on \S+ killed by SIGKILL "
        rf"\(attempt 0\), node \S+:{agents[1].pid}; restarting the group",
        stream="err",
        timeout=1,
    )
    assert checkpoint(tmp_path)["step"] == 100
    assert cluster.leftovers() == {}


def test_hung_worker_stacks_dumped_group_restarts_job_finishes(cluster, tmp_path):
    port, logs = free_port(), tmp_path / "logs"
    env = steps_env(tmp_path, steps=60, HANG="1:5")  # rank 1 goes silent at step 5 of attempt 0
    # Not shorter: a forked (--preload) worker's exit finalises the zygote's preloaded heap, as a
    # spawned one does (test_preload_exit): 0.7 s per worker here, over 2 s with four exiting at
    # once on a loaded machine, and a --hang_timeout that short calls a finished worker's exit a hang.
    events = [tmp_path / f"events{i}.jsonl" for i in range(2)]
    agents = [
        cluster.start(
            *c10d(port, "2", "--max_restarts", "1", "--hang_timeout", "5", "--log_dir", str(logs), nproc=2),
            "--events_file",
            str(events[i]),
            STEPS,
            env=env,
        )
        for i in range(2)
    ]
    rcs = [a.wait(120) for a in agents]
    assert rcs == [0, 0], "\n=====\n".join(a.stderr[-3000:] for a in agents)
    # the node rank 1 ran on in attempt 0 (in attempt 1 the other node may take ranks 0 and 1)
    hung = next(a for a in agents if re.search(r" rank1\]: start rank=1 world=4 restart=0 ", a.stdout))
    assert "rank 1 made no progress for" in hung.stderr and "(--hang_timeout); dumping its stacks" in hung.stderr, (
        hung.stderr
    )
    assert re.search(r"rank1\]: .*in stuck_in_collective", hung.stderr), hung.stderr  # faulthandler's dump, prefixed
    for a in agents:
        assert [s["restart"] for s in starts(a)] == ["0", "0", "1", "1"], a.stdout
    dumps = [p for p in logs.glob("*/attempt_0/1/stderr.log") if "in stuck_in_collective" in p.read_text()]
    assert len(dumps) == 1, list(logs.rglob("*"))  # the stacks are in the hung rank's log file too
    assert checkpoint(tmp_path)["step"] == 60
    for path in events:  # the stop of round 0 never waited out its grace, hung rank or not
        log = [json.loads(line) for line in path.read_text().splitlines()]
        stop = next(e for e in log if e["event"] == "stopping")
        gone = [e["time"] for e in log if e["event"] == "exit" and e["time"] >= stop["time"]][:2]
        assert len(gone) == 2 and max(gone) - stop["time"] < stop["grace"], log
    assert cluster.leftovers() == {}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("peer", ["waits", "fails"])
def test_a_stopped_worker_is_killed_at_once_when_its_group_stops(cluster, tmp_path, peer):
    """Rank 1 stops itself (SIGSTOP: it acts on no signal but SIGKILL) at step 5. `waits`: rank 0 waits
    for it in a collective, both are hung after --hang_timeout 2 (a stopped worker cannot dump its stacks:
    it is killed); `fails`: rank 0 fails at step 8, and the stop finds rank 1 stopped. Either way the
    stopped worker is SIGKILLed at once, not after the 30 s --shutdown_timeout (SIGTERM would stay pending)."""
    events = tmp_path / "events.jsonl"
    fault = {"waits": {"HANG": "0:5"}, "fails": {"FAIL_AT": "0:8"}}[peer]
    env = steps_env(tmp_path, steps=20, STOP="1:5", **fault)
    flags = ("--max_restarts", "1", "--hang_timeout", "2", "--shutdown_timeout", "30", "--events_file", str(events))
    a = cluster.start("--nproc_per_node", "2", *flags, STEPS, env=env)
    assert a.wait(90) == 0, a.stderr[-3000:]
    log = [json.loads(line) for line in events.read_text().splitlines()]
    stop = next(e["time"] for e in log if e["event"] == "stopping")
    again = [e["time"] for e in log if e["event"] == "running"][1]
    assert again - stop < 10, again - stop  # the 30 s grace was not waited
    assert re.search(r"rank 1 .*is stopped \(SIGSTOP or a debugger\): killing it", a.stderr), a.stderr[-3000:]
    assert [e["returncode"] for e in log if e["event"] == "exit" and e["rank"] == 1][0] == -signal.SIGKILL
    assert [s["restart"] for s in starts(a) if s["rank"] == "0"] == ["0", "1"]
    assert checkpoint(tmp_path)["step"] == 20
    assert cluster.leftovers() == {}


@pytest.mark.timeout(240)
def test_a_node_frozen_longer_than_the_hang_timeout_is_not_hung(cluster, tmp_path):
    """A node stopped whole (agent and workers: a paused VM, a stalled host) for longer than
    --hang_timeout has no hung worker when it resumes: the hang clock counts only the time the agent
    ran (issue 32; before, every rank was declared hung on resume and the healthy job failed)."""
    env = steps_env(tmp_path, steps=60)
    node = cluster.start(*c10d(free_port(), "1", "--max_restarts", "0", "--hang_timeout", "2", nproc=2), STEPS, env=env)
    node.wait_for(r"step rank=\d n=5", count=2)
    frozen = [node.pid, *node.workers()]  # the whole node stops: agent and workers (not the guard)
    assert len(frozen) == 3
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(3.5)  # the fault: a freeze 1.5 s past the hang timeout
    for pid in frozen:
        os.kill(pid, signal.SIGCONT)
    assert node.wait(60) == 0, node.stderr[-3000:]
    assert "made no progress" not in node.stderr, node.stderr
    assert {s["restart"] for s in starts(node)} == {"0"}
    assert checkpoint(tmp_path)["step"] == 60
    assert cluster.leftovers() == {}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fail_rank", [3, 1], ids=["on-the-second-node", "on-the-store-host"])
def test_a_remote_ranks_exception_is_the_root_cause_on_every_node(cluster, fail_rank):
    port = free_port()
    env = {"FAIL_RANK": str(fail_rank), "SLEEP": "60"}
    agents = [cluster.start(*c10d(port, "2", nproc=2), worker("raise_rank.py"), env=env) for _ in range(2)]
    assert [a.wait(60) for a in agents] == [1, 1], [a.stderr[-3000:] for a in agents]
    assert_one_story([a.stderr for a in agents], fail_rank, f"RuntimeError: loss is NaN at step 7 on rank {fail_rank}")
    assert cluster.leftovers() == {}


@pytest.mark.timeout(240)
def test_a_node_that_never_comes_is_waited_for_out_loud(cluster):
    alone = cluster.start(*c10d(free_port(), "2", conf="join_timeout=30"), worker("node_info.py"))
    t0 = time.monotonic()
    alone.wait_for(
        r"launcher: waiting for nodes in round 0: 1 joined \(min 2, max 2\); join timeout in 2\d s",
        stream="err",
        timeout=20,
    )
    assert time.monotonic() - t0 < 15  # the first line comes after 5 s (with the start and the interpreter's import)
    alone.signal(signal.SIGTERM)
    assert alone.wait(20) == 128 + signal.SIGTERM


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stopped", ["client", "host"])
def test_a_node_stopped_by_a_signal_is_named_with_it(cluster, stopped):
    """A client node leaves: the other says who left and why, then, with a restart to spare, which group
    rank it waits to fill and why (one rule for a departure and a death: docs/spares.md). The
    store-hosting node leaves: it closes the job saying so, and the other ends with that reason."""
    port = free_port()
    host, client = (
        cluster.start(
            *c10d(port, "2", "--max_restarts", "1", conf=f"join_timeout=30,replace_timeout=30,is_host={h}"),
            worker("node_info.py"),
            env={"SLEEP": "60"},
        )
        for h in ("true", "false")
    )
    for a in (host, client):
        a.wait_for(r" info rank=")
    gone, stays = (client, host) if stopped == "client" else (host, client)
    gone.signal(signal.SIGTERM)
    assert gone.wait(30) == 128 + signal.SIGTERM
    node = rf"\S+:{gone.pid}"
    if stopped == "client":
        stays.wait_for(
            rf"launcher: membership changed \({node} left: stopped by SIGTERM\); re-forming the job",
            stream="err",
            timeout=15,
        )
        stays.wait_for(
            rf"waiting for a node to fill group rank \d in round 1 \({node} left: stopped by SIGTERM\): "
            r"1 joined of 2; no spare at hand; replace timeout in 2\d s",
            stream="err",
            timeout=15,
        )
        stays.signal(signal.SIGTERM)
        assert stays.wait(30) == 128 + signal.SIGTERM
    else:
        assert stays.wait(30) == 75  # a node lost: requeue (docs/policy.md)
        why = rf"the node hosting the store \({node} left: stopped by SIGTERM\); closed by node {node}"
        stays.wait_for(rf"launcher: the job was closed \({why}\); stopping the workers", stream="err", timeout=5)
        stays.wait_for(rf"launcher: reason: the job was closed: {why}$", stream="err", timeout=5)
        assert "closed the connection" not in stays.stderr and "lost the rendezvous store" not in stays.stderr, (
            stays.stderr
        )


# ---------------------------------------------------------------------------- the disk of --log_dir


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (root only); unmounted (with anything stacked on it) at the end."""
    if not ROOTED:
        pytest.skip("needs root to mount a tmpfs")
    path = tmp_path / "disk"
    path.mkdir()
    try:
        sh("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path))
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    try:
        yield path
    finally:
        for _ in range(3):  # a read-only bind on top, then the tmpfs
            if subprocess.run(["umount", "-l", str(path)], capture_output=True).returncode:
                break


def test_log_dir_disk_full_job_goes_on_and_says_so(cluster, tmp_path, small_disk):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    env = steps_env(ckpt, steps=20, SPAM="40", FAIL_AT="1:5")  # 2 x 40 KiB of output on a 64 KiB disk
    a = cluster.start("--nproc_per_node", "2", "--max_restarts", "1", "--log_dir", str(small_disk), STEPS, env=env)
    assert a.wait(60) == 0, a.stderr[-3000:]
    assert "No space left on device" in a.stderr and "the job goes on" in a.stderr, a.stderr
    assert "Traceback" not in a.stderr
    assert [s["restart"] for s in starts(a) if s["rank"] == "0"] == ["0", "1"]  # the restart happened on a full disk
    assert checkpoint(ckpt)["step"] == 20
    written = 0
    for rank in (0, 1):  # the console has everything; each file holds a prefix of it, never garbage
        printed = "".join(
            l.split("]: ", 1)[1] + "\n" for l in a.out if l.startswith(f"[rank{rank}]: ") and "restart=1" not in l
        )
        for log in small_disk.glob(f"*/attempt_0/{rank}/stdout.log"):
            text = log.read_text()
            assert printed.startswith(text), (rank, len(text))
            written += len(text)
    assert written > 16 << 10  # the disk did take what fitted
    assert cluster.leftovers() == {}


@pytest.mark.parametrize("when", ["at start", "between attempts"])
def test_log_dir_read_only_job_goes_on_and_says_so(cluster, tmp_path, small_disk, when):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    read_only = ["mount", "--bind", "-o", "ro", str(small_disk), str(small_disk)]
    if when == "at start":
        sh(*read_only)
    env = steps_env(ckpt, steps=30, FAIL_AT="1:10", TMPDIR=str(tmp_path))
    a = cluster.start("--nproc_per_node", "2", "--max_restarts", "1", "--log_dir", str(small_disk), STEPS, env=env)
    if when == "between attempts":
        a.wait_for(r"step rank=1 n=3")
        sh(*read_only)  # attempt 0's files stay open below; attempt 1 finds the folder read-only
    assert a.wait(60) == 0, a.stderr[-3000:]
    assert "Read-only file system" in a.stderr and "Traceback" not in a.stderr, a.stderr
    assert [s["restart"] for s in starts(a) if s["rank"] == "0"] == ["0", "1"]
    assert checkpoint(ckpt)["step"] == 30
    if when == "between attempts":
        logs = list(small_disk.glob("*/attempt_0/1/stdout.log"))
        assert len(logs) == 1 and "step rank=1 n=9" in logs[0].read_text()  # attempt 0's log is whole
    else:  # the logs went to a temporary folder, which the launcher named
        logs = list(tmp_path.glob("launcher-*/attempt_1/1/stdout.log"))
        assert len(logs) == 1 and "done rank=1" in logs[0].read_text() and str(logs[0].parents[2]) in a.stderr
    assert cluster.leftovers() == {}


# ---------------------------------------------------------------------------- ports


class Squatter:
    """Another program on a port: `silent` accepts and never answers; `chatty` answers HTTP and hangs up."""

    def __init__(self, port: int, kind: str):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.kind, self.conns = kind, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.kind == "chatty":
                try:
                    conn.recv(100)
                    conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
                except OSError:
                    pass
                conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def squat():
    made = []
    yield lambda port, kind="silent": made.append(Squatter(port, kind)) or made[-1]
    for s in made:
        s.close()


def one_line_error(text: str) -> None:
    assert "Traceback" not in text and "frame #" not in text, text  # no Python or C++ stack for the user


def test_static_master_port_taken_is_a_clear_error(cluster, tmp_path, squat):
    port = free_port()
    squat(port)
    t0 = time.monotonic()
    a = cluster.start(
        "--nnodes", "1", "--master_port", str(port), "--nproc_per_node", "2", STEPS, env=steps_env(tmp_path)
    )
    assert a.wait(30) == 1, a.stderr
    assert time.monotonic() - t0 < 15
    assert f"--master_port {port} is already in use on this host" in a.stderr, a.stderr
    one_line_error(a.stderr)
    assert not (tmp_path / "ckpt.json").exists()  # no worker ran
    assert cluster.leftovers() == {}


@pytest.mark.parametrize("kind, conf", [("silent", ""), ("chatty", ""), ("silent", "is_host=true")])
def test_c10d_endpoint_taken_by_another_program_is_a_clear_error(cluster, tmp_path, squat, kind, conf):
    port = free_port()
    squat(port, kind)
    t0 = time.monotonic()
    a = cluster.start(
        *c10d(port, "2", conf=",".join(filter(None, ["join_timeout=3,read_timeout=2", conf]))),
        STEPS,
        env=steps_env(tmp_path),
    )
    assert a.wait(60) == 1, a.stderr
    assert time.monotonic() - t0 < 30  # join_timeout + read_timeout + 5 s at most
    expected = {
        "": f"rendezvous store at 127.0.0.1:{port}",
        "is_host=true": f"cannot host the rendezvous store on 127.0.0.1:{port}: port taken",
    }
    assert expected[conf] in a.stderr and ("another program on that port" in a.stderr or conf), a.stderr
    one_line_error(a.stderr)
    assert cluster.leftovers() == {}


def test_standalone_store_port_taken_is_a_usage_error(cluster, squat):
    port = free_port()
    squat(port)
    a = cluster.start("store", "--host", "127.0.0.1", "--port", str(port))
    assert a.wait(30) == 2
    assert a.err == [f"launcher store: error: cannot serve on 127.0.0.1:{port}: Address already in use"], a.err


# ---------------------------------------------------------------------------- a slow node


def test_slow_joining_node_gets_a_new_round_not_charged_to_the_budget(cluster, tmp_path):
    port = free_port()
    env = steps_env(tmp_path, steps=70)
    args = c10d(port, "2:3", "--max_restarts", "0")
    early = [cluster.start(*args, STEPS, env=env, name=f"early{i}") for i in range(2)]
    for a in early:
        a.wait_for(r"start rank=\d world=2")  # formed without the third, after the 1 s last call
    wait_checkpoint(tmp_path, 10)
    late = cluster.start(*args, STEPS, env=env, name="late")
    for a in (*early, late):
        a.wait_for(r"start rank=\d world=3 restart=0", timeout=30)
    for a in (*early, late):
        assert a.wait(90) == 0, a.stderr[-3000:]
        assert {s["restart"] for s in starts(a)} == {"0"}
    assert "wants to join" in early[0].stderr
    assert_rounds_consistent([*early, late])
    ck = checkpoint(tmp_path)
    assert ck["step"] == 70 and ck["world"] == 3
    assert int(starts(late)[0]["from"]) >= 10  # the new round resumed from the checkpoint
    assert cluster.leftovers() == {}
