"""The episode's processes: started with a TEST_TOKEN of their own, their output read with each line's arrival time."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

from support.ports import free_port
from support.processes import is_helper, parent_pid, procs_with_token

from .records import AgentRecord

ROOT = Path(__file__).resolve().parents[2]
STEPS = ROOT / "tests" / "workers" / "steps.py"
IN_PLACE_STEPS = ROOT / "tests" / "workers" / "in_place_steps.py"


def signal_all(pids: list[int], sig: int) -> None:
    """Send `sig` to each of `pids`; one already gone is skipped."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def ports(n: int) -> list[int]:
    """`n` distinct free ports (free_port may hand out one port twice in a row)."""
    got: list[int] = []
    while len(got) < n:
        port = free_port()
        if port not in got:
            got.append(port)
    return got


def sh(*args: str) -> subprocess.CompletedProcess:
    """Run a short command, its output captured."""
    return subprocess.run(args, capture_output=True, text=True, timeout=10)


class Proc:
    """A process of the episode with its own TEST_TOKEN, in network namespace `host` if given; stdout
    and stderr read into lists by threads, with each line's arrival time."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], host: str | None = None):
        self.name, self.token, self.host = name, uuid.uuid4().hex, host
        full = dict(os.environ, PYTHONPATH=str(ROOT), TEST_TOKEN=self.token, **env)
        full.pop("PET_PRELOAD", None)
        cmd = ["ip", "netns", "exec", host, *argv] if host else argv  # ip execs the command: same pid
        self.popen = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full, start_new_session=True
        )
        self.out: list[str] = []
        self.out_at: list[float] = []
        self.err: list[str] = []
        self.err_at: list[float] = []
        self.ended_at: float | None = None  # when its stdout closed: it ended
        self.readers = [
            threading.Thread(target=self._read, args=(s, into, at), daemon=True)
            for s, into, at in ((self.popen.stdout, self.out, self.out_at), (self.popen.stderr, self.err, self.err_at))
        ]
        for t in self.readers:
            t.start()
        self.killed = False  # by the campaign: its lines may be lost with it

    def _read(self, stream, into: list[str], at: list[float]) -> None:
        for line in stream:
            at.append(time.monotonic())
            into.append(line.rstrip("\n"))
        if stream is self.popen.stdout:
            self.ended_at = time.monotonic()

    def workers(self) -> list[int]:
        """The pids of its children (its workers), helpers left out."""
        return [
            p
            for p in procs_with_token(self.token)
            if p != self.popen.pid and not is_helper(p) and parent_pid(p) == self.popen.pid
        ]

    def started(self) -> int:
        """How many workers it has started so far (the steps worker's "start" lines)."""
        return sum(" start rank=" in line for line in list(self.out))

    def left(self) -> list[int]:
        """The pids still carrying its token."""
        return procs_with_token(self.token)

    def record(self, rc: int | None, left: list[int]) -> AgentRecord:
        """What it left: a snapshot of its output, with its exit `rc` and the pids `left` after it."""
        out, err = list(self.out), list(self.err)  # the reader threads may still append: lines first, times after
        return AgentRecord(
            self.name,
            rc,
            self.killed,
            tuple(out),
            tuple(self.out_at[: len(out)]),
            tuple(err),
            tuple(self.err_at[: len(err)]),
            self.ended_at,
            tuple(left),
        )

    def finish(self, timeout: float) -> int | None:
        """Its exit status once it ended within `timeout` s (its output read to the end), else None."""
        try:
            rc = self.popen.wait(max(0.1, timeout))
        except subprocess.TimeoutExpired:
            return None
        for t in self.readers:
            t.join(5)
        return rc

    def kill_all(self) -> None:
        """SIGKILL it and everything carrying its token (SIGCONT first: a stopped one too)."""
        pids = [self.popen.pid, *procs_with_token(self.token)]
        signal_all(pids, signal.SIGCONT)
        signal_all(pids, signal.SIGKILL)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass
