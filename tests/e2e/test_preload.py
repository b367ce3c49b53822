"""--preload: workers forked from a zygote that imported torch once, with every guarantee of a spawn."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
from support.paths import ROOT, worker
from support.processes import comm, procs_with_token, wait_for, wait_gone

# What legitimately differs between two launches of the same job (a fresh run folder, port, ids).
PER_LAUNCH = {
    "DUMP_DIR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "LAUNCHER_AGENT_ID",
    "LAUNCHER_PROGRESS_FILE",
    "LAUNCHER_INPLACE_SLOTS",  # the agent's folder in memory, named for its pid
}


def _dump(launch, tmp_path, name: str, args: list[str], env: dict) -> dict:
    out = tmp_path / name
    out.mkdir()
    r = launch.run(*args, env={**env, "DUMP_DIR": str(out)}, timeout=90)
    assert r.returncode == 0, r.stderr
    dumps = {}
    for path in sorted(out.iterdir()):
        d = json.loads(path.read_text())
        d["env"] = {k: v for k, v in d["env"].items() if k not in PER_LAUNCH}
        dumps[path.stem] = d
    return dumps


def _zygote_of(token: str) -> int | None:
    return next((pid for pid in procs_with_token(token) if comm(pid) == "launcher-zygote"), None)


# Pairwise, not the full product: OMP_NUM_THREADS unset (one worker: left unset; two: the launcher's 1)
# and the user's own, each world size, script and module are met (each case is two torch jobs, ~9 s of
# CPU here; a user's "1" is the launcher's own 1 with two workers, and is not run again).
@pytest.mark.parametrize("omp, nproc, as_module", [(None, 1, False), (None, 2, True), ("4", 2, False)])
def test_forked_worker_matches_a_spawned_one(launch, tmp_path, monkeypatch, omp, nproc, as_module):
    env = {"OMP_NUM_THREADS": omp} if omp else {}
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # unset: the launcher's own rule decides
    target = ["-m", "parity"] if as_module else [worker("parity.py")]
    if as_module:
        env["PYTHONPATH"] = f"{ROOT}:{ROOT / 'tests' / 'workers'}"
    args = ["--nproc_per_node", str(nproc), *target]
    spawned = _dump(launch, tmp_path, "spawned", args, env)
    forked = _dump(launch, tmp_path, "forked", ["--preload", *args], env)
    assert sorted(spawned) == sorted(forked) == [str(r) for r in range(nproc)]
    for rank in spawned:
        s, f = spawned[rank], forked[rank]
        assert not s.pop("forked") and f.pop("forked"), "the preload did not fork this worker"
        if as_module:  # python -m puts the module's full path in argv[0], like runpy
            assert s["argv"][0] == f["argv"][0] == str(ROOT / "tests" / "workers" / "parity.py")
        assert s == f
        assert f["own_group"] and f["parent_is_agent"] and not f["cuda_initialized"]


def test_zygote_killed_mid_job_falls_back_to_spawning(launch, tmp_path):
    p = launch.start(
        "--preload", "--nproc_per_node", "2", "--max_restarts", "1", worker("held.py"), env={"DUMP_DIR": str(tmp_path)}
    )
    wait_for(lambda: (tmp_path / "0-0").exists() and (tmp_path / "0-1").exists(), 60, "attempt 0's workers")
    assert all((tmp_path / f"0-{r}").read_text().endswith(" 1") for r in (0, 1)), "attempt 0 was not forked"
    zygote = _zygote_of(launch.token)
    assert zygote, "no zygote found"
    os.kill(zygote, signal.SIGKILL)
    (tmp_path / "go").touch()  # rank 0 fails: the restart must spawn
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert all((tmp_path / f"1-{r}").read_text().endswith(" 0") for r in (0, 1)), "attempt 1 was not spawned"
    lines = [line for line in err.splitlines() if "preload:" in line]
    assert len(lines) == 1 and "killed by SIGKILL" in lines[0] and "spawned instead" in lines[0], err
    assert not wait_gone(launch.token)


def test_a_slow_preload_is_said_and_the_workers_still_fork(launch, tmp_path):
    """The agent waits for the zygote's imports before it forks a worker: past 1 s it says so, then
    every 10 s (torch's import alone is 2-20 s on a busy host: the demo sat silent there)."""
    env = {"DUMP_DIR": str(tmp_path), "PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'workers'}"}
    r = launch.run("--preload_modules", "slowmod", "--nproc_per_node", "1", worker("parity.py"), env=env, timeout=90)
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "importing torch once for the workers to fork from" in line]
    assert said and all(line.endswith(" s so far; they start when it is done") for line in said), r.stderr
    seconds = [int(re.search(r"(\d+) s so far", line)[1]) for line in said]
    assert all(later - earlier >= 9 for earlier, later in zip(seconds, seconds[1:])), said  # then every 10 s
    assert json.loads((tmp_path / "0.json").read_text())["forked"]


def test_preload_module_that_fails_to_import_is_one_line(launch, tmp_path):
    r = launch.run(
        "--preload_modules",
        "-torch,no_such_module_xyz",  # the failing module alone: torch's ~2.5 s of CPU would change nothing here
        "--nproc_per_node",
        "2",
        worker("parity.py"),
        env={"DUMP_DIR": str(tmp_path)},
        timeout=90,
    )
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "preload:" in line]
    assert len(lines) == 1 and "'no_such_module_xyz' failed to import (ModuleNotFoundError" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not any(json.loads((tmp_path / f"{r}.json").read_text())["forked"] for r in (0, 1))


def test_preload_module_that_starts_a_thread_falls_back(launch, tmp_path):
    env = {"DUMP_DIR": str(tmp_path), "PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'workers'}"}
    args = ("--preload_modules", "-torch,threadmod", "--nproc_per_node", "1", "--max_restarts", "0")
    p = launch.start(*args, worker("held.py"), env=env)
    wait_for(lambda: (tmp_path / "0-0").exists(), 60, "the worker")
    (tmp_path / "go").touch()
    _, err = p.communicate(timeout=60)
    lines = [line for line in err.splitlines() if "preload:" in line]
    assert len(lines) == 1 and "'threadmod' left 1 thread(s) running (threadmod-sleeper)" in lines[0], err
    assert (tmp_path / "0-0").read_text().endswith(" 0")
    assert not wait_gone(launch.token)


def test_agent_sigkill_takes_the_zygote_and_forked_workers(launch, tmp_path):
    p = launch.start("--preload", "--nproc_per_node", "2", worker("held.py"), env={"DUMP_DIR": str(tmp_path)})
    wait_for(lambda: (tmp_path / "0-0").exists() and (tmp_path / "0-1").exists(), 60, "the workers")
    assert _zygote_of(launch.token)
    p.kill()
    p.wait(10)
    assert not wait_gone(launch.token, timeout=10), "the zygote or a forked worker survived the agent"


def test_bad_preload_module_name_is_a_usage_error(launch):
    r = launch.run("--preload_modules", "torch,not-a-module", worker("exit_code.py"))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "--preload_modules 'not-a-module' is not a module name" in r.stderr


def test_no_python_workers_are_spawned(launch, tmp_path):
    r = launch.run("--preload", "--no_python", "--nproc_per_node", "2", "sh", "-c", "echo $RANK")
    assert r.returncode == 0, r.stderr
    assert "[rank0]: 0" in r.stdout and "[rank1]: 1" in r.stdout
