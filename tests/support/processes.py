"""Processes the tests started, found by the TEST_TOKEN in their environment; waiting on conditions."""

from __future__ import annotations

import os
import subprocess
import time

import pytest


def procs_with_token(token: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment carries TEST_TOKEN=token."""
    marker = f"\0TEST_TOKEN={token}\0".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = b"\0" + f.read() + b"\0"
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in env and state != "Z":
            found.append(int(name))
    return found


def kill_leftovers(procs: list[subprocess.Popen], token: str, settle: float = 0.0) -> None:
    """Teardown: kill what a test started, let the agents' guards clean up after them, give the rest
    `settle` s to go, then SIGKILL every process that still carries `token`."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    let_guards_finish(token)
    if settle:
        wait_gone(token, settle)
    for pid in procs_with_token(token):
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def let_guards_finish(token: str, timeout: float = 5.0) -> None:
    """Wait (bounded) for the guards of agents just killed to finish: each SIGKILLs its agent's workers
    and removes its folder in /dev/shm, which a SIGKILL of the guard too would leave behind."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(is_guard(pid) for pid in procs_with_token(token)):
        time.sleep(0.02)


def wait_gone(token: str, timeout: float = 5.0) -> list[int]:
    """Wait until no process carries `token`; return the survivors (empty is good)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = procs_with_token(token)
        if not left:
            return []
        time.sleep(0.05)
    return procs_with_token(token)


def parent_pid(pid: int) -> int:
    """The parent of `pid`, or -1 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def comm(pid: int) -> str:
    """The process name of `pid` (what ps shows), "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def is_guard(pid: int) -> bool:
    """Whether `pid` is an agent's guard."""
    return comm(pid) == "launcher-guard"


def is_helper(pid: int) -> bool:
    """Whether `pid` is one of an agent's helpers (its guard or its zygote), not a worker."""
    return comm(pid) in ("launcher-guard", "launcher-zygote")


def wait_for(predicate, timeout: float = 20.0, what: str = "a condition", proc: subprocess.Popen | None = None):
    """Poll `predicate` until it returns something true, and return that; on timeout fail with `what` (and
    the launcher's output if it ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate(timeout=10)
            pytest.fail(f"launcher ended (rc {proc.returncode}) while waiting for {what}\n{out}\n{err}")
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def sh(*args: str) -> None:
    """Run a short system command (ip, mount, ...); raise if it fails."""
    subprocess.run(args, check=True, capture_output=True, timeout=10)
