"""What the fault tests (tests/e2e/test_faults*.py) share: the checkpointing steps worker, its lines and
checkpoint, the c10d flags of their jobs, and checks on the rounds the agents ran."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from support import system
from support.launcher_runs import Agent
from support.launcher_runs import c10d as shared_c10d
from support.paths import worker

ROOTED = os.geteuid() == 0 and shutil.which("mount") is not None  # a tmpfs: util-linux, always there
NETNS = ROOTED and system.which("ip") is not None  # network namespaces: iproute2, a system package


c10d = functools.partial(shared_c10d, run_id="faults")


def starts(agent: Agent) -> list[dict]:
    """Every "start" line of the steps worker, parsed."""
    return [dict(re.findall(r"(\w+)=(\S+)", l)) for l in agent.out if " start rank=" in l]


def checkpoint(ckpt_dir: Path) -> dict:
    """The checkpoint, which must always be whole JSON (written by rename)."""
    return json.loads((ckpt_dir / "ckpt.json").read_text())


def steps_env(ckpt_dir: Path, steps: int = 30, step_time: float = 0.1, **more: str) -> dict:
    return {"CKPT_DIR": str(ckpt_dir), "STEPS": str(steps), "STEP_TIME": str(step_time), **more}


STEPS = worker("steps.py")


def wait_checkpoint(ckpt_dir: Path, step: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if checkpoint(ckpt_dir)["step"] >= step:
                return
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    pytest.fail(f"no checkpoint of step {step} within {timeout} s")


def rounds_of(agents: list[Agent]) -> dict[str, list[dict]]:
    """round number -> the "start" lines of every worker in it, across agents."""
    by_round: dict[str, list[dict]] = {}
    for a in agents:
        for s in starts(a):
            by_round.setdefault(s["round"], []).append(s)
    return by_round


def assert_rounds_consistent(agents: list[Agent]) -> None:
    """In every round each global rank ran exactly once and everyone agreed on the world size."""
    for rnd, seen in rounds_of(agents).items():
        worlds = {s["world"] for s in seen}
        assert len(worlds) == 1, (rnd, seen)
        ranks = sorted(int(s["rank"]) for s in seen)
        assert ranks == list(range(int(worlds.pop()))), (rnd, seen)


def first_line_after(agents: list[Agent], pattern: str, t0: float, timeout: float = 20) -> float:
    """Seconds from t0 until any of `agents` printed a stderr line matching `pattern` (polled every 5 ms)."""
    rx, deadline = re.compile(pattern), time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(rx.search(line) for a in agents for line in list(a.err)):
            return time.monotonic() - t0
        time.sleep(0.005)
    pytest.fail(
        f"no stderr line matching {pattern!r} within {timeout} s\n" + "\n".join(a.stderr[-2000:] for a in agents)
    )
