"""--recovery in-place: the agent gives its workers a private folder in memory ($LAUNCHER_INPLACE_SLOTS, in
/dev/shm, mode 0700, named for the run and the agent), and nothing of it is left once the agent exits:
after a success, a failure, a SIGTERM, and (through the guard) a SIGKILL of the agent."""

from __future__ import annotations

import glob
import os
import re
import signal
import stat
import uuid

import pytest
from support.launcher_runs import Launch, wait_line
from support.paths import WORKERS
from support.processes import wait_for

WORKER = str(WORKERS / "in_place_keys.py")
pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")


def flags(run_id: str, *more: str) -> list[str]:
    return ["--nproc_per_node", "2", "--recovery", "in-place", "--rdzv_id", run_id, "--no-live", *more, WORKER]


def folders(out: str) -> set[str]:
    return set(re.findall(r"slots=(\S+)", out))


def left(run_id: str) -> list[str]:
    return glob.glob(f"/dev/shm/launcher-{run_id}-*")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fails", [False, True], ids=["success", "failure"])
def test_the_workers_memory_folder_is_the_agents_and_goes_with_it(tmp_path, fails):
    run_id = f"slots{uuid.uuid4().hex[:8]}"
    launch = Launch()
    try:
        r = launch.run(*flags(run_id, "--max_restarts", "0"), timeout=50, env={"FAIL": "1"} if fails else {})
    finally:
        launch.cleanup()
    assert (r.returncode != 0) is fails, r.stderr
    (path,) = folders(r.stdout)  # every rank was told the same folder
    assert re.fullmatch(rf"/dev/shm/launcher-{run_id}-\d+-\w+", path), path
    assert not os.path.exists(path) and left(run_id) == [], r.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_workers_memory_folder_goes_when_the_agent_is_stopped(tmp_path, sig):
    run_id = f"slots{uuid.uuid4().hex[:8]}"
    launch = Launch()
    try:
        agent = launch.start(*flags(run_id), env={"HOLD": "1"})
        seen = ""
        while seen.count("in rank=") < 2:  # both ranks in, each with the folder it was told
            seen += wait_line(agent, "in rank=", timeout=40)
        (path,) = folders(seen)
        mode = os.stat(path).st_mode
        assert stat.S_IMODE(mode) == 0o700 and str(agent.pid) in path
        assert sorted(os.listdir(path)) == ["0", "1"]  # each rank wrote its own file there
        agent.send_signal(sig)
        agent.wait(30)
        wait_for(lambda: not os.path.exists(path), 10, "the folder removed")  # by the guard after a SIGKILL
        assert left(run_id) == []
    finally:
        launch.cleanup()
