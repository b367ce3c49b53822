"""The launcher run as a real subprocess: one (`Launch`) or several agents of a job (`Cluster`, each
an `Agent` whose output threads read), the flags of a c10d job, and what tests read from the output."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid

import pytest

from support.paths import LAUNCHER, ROOT
from support.processes import is_helper, kill_leftovers, let_guards_finish, parent_pid, procs_with_token, wait_gone


def launcher_env(token: str, preload: bool, args: tuple[str, ...], extra: dict | None) -> dict:
    """The environment of a launcher a test starts: its TEST_TOKEN, the checkout on PYTHONPATH, and with
    `preload` PET_PRELOAD=1. The zygote then preloads torch only where the script run imports it:
    otherwise `-torch` (a torch import is ~2 s of CPU here, and most test workers never use it). Where it
    does, the whole default set for a script that makes a DDP or an optimizer (each imports torch._dynamo,
    so a worker forked without it would import it again, each one), else `-torch._dynamo` (~2 s more per
    zygote). A test that passes --preload itself gets the defaults where its script imports torch
    (test_preload compares such a run's environment with a spawned one's), else `-torch` too; its own
    --preload_modules wins over both."""
    env = dict(os.environ, TEST_TOKEN=token, PYTHONPATH=str(ROOT))
    env.pop("PYTEST_CURRENT_TEST", None)
    env.pop("PET_PRELOAD", None)
    need = max((_torch_need(a) for a in args), default=_NO_TORCH)
    if preload:
        env["PET_PRELOAD"] = "1"
        if _DROPPED[need]:
            env["PET_PRELOAD_MODULES"] = _DROPPED[need]
    elif "--preload" in args and need == _NO_TORCH and any(a.endswith(".py") for a in args):  # a script read
        env["PET_PRELOAD_MODULES"] = "-torch"
    env.update(extra or {})
    return env


_NO_TORCH, _TORCH, _DYNAMO = range(3)  # what a script needs preloaded, in increasing order
_DROPPED = {_NO_TORCH: "-torch", _TORCH: "-torch._dynamo", _DYNAMO: None}  # --preload_modules for each


def _torch_need(arg: str) -> int:
    """What `arg` needs of the zygote: a Python file that makes a DDP or an optimizer (or a
    `launcher.worker...` module, which may) `_DYNAMO`; one that imports torch only `_TORCH`, as do the
    workloads (`launcher check`, `launcher bench allreduce`: collectives, no DDP, no optimizer)."""
    if arg in ("check", "bench"):
        return _TORCH
    if arg.startswith("launcher.worker"):
        return _DYNAMO
    if not arg.endswith(".py") or not os.path.isfile(arg):
        return _NO_TORCH
    with open(arg) as f:
        text = f.read()
    if not re.search(r"^\s*(import|from) torch\b", text, re.M):
        return _NO_TORCH
    return _DYNAMO if re.search(r"DistributedDataParallel|\boptim\b", text) else _TORCH


class Launch:
    """Runs `python -m launcher ARGS` with a unique TEST_TOKEN and kills leftovers at teardown.

    `preload`: the workers are forked from a preloaded zygote (PET_PRELOAD=1), not spawned.
    """

    def __init__(self, preload: bool = False):
        self.token = uuid.uuid4().hex
        self.preload = preload
        self.procs: list[subprocess.Popen] = []

    def env(self, extra: dict | None = None, args: tuple[str, ...] = ()) -> dict:
        return launcher_env(self.token, self.preload, args, extra)

    def run(self, *args: str, timeout: float = 60, env: dict | None = None, cwd: str | None = None):
        """Run to completion; returns CompletedProcess with text stdout/stderr."""
        return subprocess.run(
            [*LAUNCHER, *args], capture_output=True, text=True, timeout=timeout, env=self.env(env, args), cwd=cwd
        )

    def start(self, *args: str, env: dict | None = None, **kw) -> subprocess.Popen:
        """Start in the background (stdout/stderr piped, text)."""
        p = subprocess.Popen(
            [*LAUNCHER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env(env, args), **kw
        )
        self.procs.append(p)
        return p

    def cleanup(self) -> None:
        kill_leftovers(self.procs, self.token)


class Agent:
    """One launcher process; its output is read by threads into lists, so a pipe never fills."""

    def __init__(self, popen: subprocess.Popen, token: str, name: str):
        self.popen, self.token, self.name = popen, token, name
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(s, l), daemon=True)
            for s, l in ((popen.stdout, self.out), (popen.stderr, self.err))
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout(self) -> str:
        return "\n".join(self.out)

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)

    def wait_for(self, pattern: str, timeout: float = 90, stream: str = "out", count: int = 1) -> re.Match:
        """Block until `count` lines of stdout (or stderr) match `pattern`; fail with the output so far.
        The bound holds on a busy host: a --preload node imports torch first, 20 s and more at a load of 10."""
        lines, rx = (self.out if stream == "out" else self.err), re.compile(pattern)
        deadline, seen = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            while seen < len(lines):
                m = rx.search(lines[seen])
                seen += 1
                if m:
                    count -= 1
                    if count == 0:
                        return m
            if self.popen.poll() is not None and seen >= len(lines):
                for t in self._readers:
                    t.join(2)
                if seen >= len(lines):
                    break
            time.sleep(0.02)
        pytest.fail(
            f"{self.name}: no line matching {pattern!r} (rc {self.popen.poll()})\n"
            f"{self.stdout[-3000:]}\n{self.stderr[-3000:]}"
        )

    def wait(self, timeout: float = 60) -> int:
        """Its exit code; a test fails with its output if it is still running after `timeout` s."""
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not end within {timeout} s\n{self.stdout[-2000:]}\n{self.stderr[-4000:]}")
        for t in self._readers:
            t.join(5)
        return rc

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def workers(self) -> list[int]:
        """Pids of this agent's processes other than itself and its helpers (guard, zygote): its workers."""
        return [
            p for p in procs_with_token(self.token) if p != self.pid and parent_pid(p) == self.pid and not is_helper(p)
        ]


class Cluster:
    """Starts agents (and a standalone store) each with its own TEST_TOKEN; kills what is left at teardown."""

    def __init__(self, preload: bool = False):
        self.agents: list[Agent] = []
        self.preload = preload  # PET_PRELOAD=1: workers forked from the zygote

    def start(self, *args: str, env: dict | None = None, netns: str | None = None, name: str = "") -> Agent:
        token = uuid.uuid4().hex
        full = launcher_env(token, self.preload, args, env)
        cmd = [*LAUNCHER, *args]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full)
        agent = Agent(popen, token, name or f"agent{len(self.agents)}")
        self.agents.append(agent)
        return agent

    def store(self, host: str, port: int, netns: str | None = None) -> Agent:
        """A standalone `launcher store`, once it says it is serving."""
        store = self.start("store", "--host", host, "--port", str(port), netns=netns, name="store")
        store.wait_for("serving on", timeout=30)
        return store

    def leftovers(self, timeout: float = 10.0) -> dict[str, list[int]]:
        """Processes still alive per agent name (agents themselves included), after waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        left = {}
        for a in self.agents:
            gone = wait_gone(a.token, max(0.1, deadline - time.monotonic()))
            if gone:
                left[a.name] = gone
        return left

    def cleanup(self) -> None:
        for a in self.agents:  # the agents first: their guards then kill their workers and remove their folders
            if os.environ.get("FAULTS_DEBUG"):  # FAULTS_DEBUG=1 pytest -s: every agent's output
                print(f"\n===== {a.name} rc={a.popen.poll()}\n{a.stdout[-4000:]}\n----- stderr\n{a.stderr[-6000:]}")
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(a.pid, sig)
                except OSError:
                    pass
        for a in self.agents:
            let_guards_finish(a.token)
            for pid in procs_with_token(a.token):
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            try:
                a.popen.wait(5)
            except subprocess.TimeoutExpired:
                pass


def c10d(
    port: int, nnodes: str, *extra: str, nproc: int = 1, run_id: str = "job", conf: str = "", host: str = "127.0.0.1"
) -> list[str]:
    """Launcher flags for a c10d job on HOST:PORT, with a 1 s last call unless `conf` says otherwise."""
    conf = ",".join(filter(None, ["last_call_timeout=1", conf]))
    return [
        "--nnodes",
        nnodes,
        "--nproc_per_node",
        str(nproc),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"{host}:{port}",
        "--rdzv_id",
        run_id,
        "--rdzv_conf",
        conf,
        *extra,
    ]


def infos(out: str) -> list[dict]:
    """The key=value fields of every " info " line a worker printed (node_info.py and friends)."""
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in out.splitlines() if " info " in line]


def marks(mark_dir, rank: int) -> list[str]:
    """The words tests/workers/signals.py noted for `rank` in `mark_dir`."""
    try:
        return (mark_dir / str(rank)).read_text().split()
    except FileNotFoundError:
        return []


def all_have(mark_dir, word: str, ranks=(0, 1)):
    return lambda: all(word in marks(mark_dir, r) for r in ranks)


def wait_line(proc: subprocess.Popen, needle: str, timeout: float = 30) -> str:
    """Until a line of the agent's stdout holds `needle`; its pipes are read by threads from then on
    (so `finish` returns everything it printed, this line included)."""
    if not hasattr(proc, "readers"):
        proc.lines, proc.out, proc.err = queue.SimpleQueue(), [], []

        def pump(pipe, into: list, lines=None) -> None:
            for line in pipe:
                into.append(line)
                if lines is not None:
                    lines.put(line)

        proc.readers = [
            threading.Thread(target=pump, args=(proc.stdout, proc.out, proc.lines), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, proc.err), daemon=True),
        ]
        for t in proc.readers:
            t.start()
    deadline, seen = time.monotonic() + timeout, ""
    while True:
        try:
            line = proc.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"never saw {needle!r} in {timeout} s: {seen}") from None
        seen += line
        if needle in line:
            return seen


def finish(procs, timeout: float = 90) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each agent, each waited for at most `timeout` s."""
    out = []
    for p in procs:
        rc = p.wait(timeout)
        if hasattr(p, "readers"):
            for t in p.readers:
                t.join(5)
            out.append((rc, "".join(p.out), "".join(p.err)))
        else:
            out.append((rc, *p.communicate(timeout=5)))
    return out


def assert_one_story(stderrs: list[str], rank: int, error: str) -> None:
    """Every node of a job whose rank `rank` raised `error` with no restart left names that rank and its
    error as the job's root cause: the node it ran on as its own, every other node as remote, each with
    the true reason; no node blames a store that closed the connection."""
    local = [e for e in stderrs if re.search(rf"launcher: root cause: rank {rank} \(local rank \d+\)", e)]
    remote = [
        e
        for e in stderrs
        if re.search(
            rf"launcher: root cause \(remote, node \S+\): rank {rank} \(local rank \d+\) on \S+ exited with code 1", e
        )
    ]
    assert len(local) == 1 and len(remote) == len(stderrs) - 1, stderrs
    assert "reason: no restarts left (--max_restarts 0)" in local[0], local[0]
    for e in remote:
        assert re.search(
            r"reason: the job was closed: restart budget spent \(--max_restarts 0\); closed by node \S+", e
        ), e
        assert "re-forming" not in e, e
    for e in stderrs:
        assert f"error: {error}" in e and "closed the connection" not in e, e


def assert_one_line_exit_2(r: subprocess.CompletedProcess) -> None:
    """Bad input: exit 2 and one line on stderr naming the error, never a traceback."""
    lines = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and ": error: " in lines[0] and "Traceback" not in r.stderr, r.stderr


def said_seconds(said: str) -> float:
    """A duration as the goodput line says it (`27 ms`, `4.3 s`, `2 m 5 s`)."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?) (ms|s|m|h)\b", said))
