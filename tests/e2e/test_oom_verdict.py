"""Issue 13: the rough edges a new user meets, each reproduced with real processes."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time

import pytest
from support.launcher_runs import all_have, marks
from support.paths import LAUNCHER, ROOT, worker
from support.ports import free_port
from support.processes import wait_for, wait_gone


def one_line_exit_2(r) -> None:
    lines = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and ": error: " in lines[0] and "Traceback" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------- 1. --no_python command


def test_no_python_missing_command_is_one_line(launch, tmp_path):
    r = launch.run("--nproc_per_node", "2", "--no_python", "nosuchcmd-launcher-test", env={"MARK_DIR": str(tmp_path)})
    one_line_exit_2(r)
    assert "nosuchcmd-launcher-test" in r.stderr and "PATH" in r.stderr


def test_no_python_file_not_executable_is_one_line(launch, tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('#!/bin/sh\ntouch "$MARK_DIR/ran"\n')
    r = launch.run("--no_python", str(script), env={"MARK_DIR": str(tmp_path)})
    one_line_exit_2(r)
    assert "not executable" in r.stderr and "chmod +x" in r.stderr
    assert not (tmp_path / "ran").exists()


def test_no_python_command_found_on_the_worker_path(launch, tmp_path):
    script = tmp_path / "mycmd"
    script.write_text("#!/bin/sh\necho ran-$RANK\n")
    script.chmod(0o755)
    r = launch.run("--no_python", "mycmd", env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    assert "ran-0" in r.stdout


def test_no_python_command_that_vanishes_between_rounds_is_a_clear_failure(launch, tmp_path):
    script = tmp_path / "once.sh"
    script.write_text('#!/bin/sh\nrm -f "$0"\nexit 3\n')  # the first attempt removes the command
    script.chmod(0o755)
    r = launch.run("--max_restarts", "2", "--no_python", str(script), timeout=60)
    assert r.returncode == 3, r.stderr  # the first attempt's root cause, as for any failed job
    assert "Traceback" not in r.stderr, r.stderr
    assert f"reason: cannot start {script}" in r.stderr, r.stderr
    assert wait_gone(launch.token) == []


# ---------------------------------------------------------------------------- 2. one signal delivered twice


def test_timeout_sigint_lets_the_workers_save(launch, tmp_path):
    """coreutils `timeout` signals the launcher, then its own process group: SIGINT twice, at once."""
    r = subprocess.run(
        [
            "timeout",
            "-s",
            "INT",
            "--preserve-status",
            "3",
            *LAUNCHER,
            "--nproc_per_node",
            "2",
            "--shutdown_timeout",
            "20",
            worker("signals.py"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=launch.env({"MARK_DIR": str(tmp_path), "EXIT_DELAY": "1"}),
    )
    assert r.returncode == 130, r.stderr
    assert "second SIGINT" not in r.stderr, r.stderr
    for rank in (0, 1):
        assert marks(tmp_path, rank) == ["ready", "SIGINT", "exit"], marks(tmp_path, rank)  # saved, then left
    assert wait_gone(launch.token) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_same_signal_twice_in_quick_succession_counts_once(launch, tmp_path, sig):
    p = launch.start(
        "--nproc_per_node",
        "2",
        "--shutdown_timeout",
        "20",
        worker("signals.py"),
        env={"MARK_DIR": str(tmp_path), "EXIT_DELAY": "1"},
    )
    wait_for(all_have(tmp_path, "ready"), what="workers ready", proc=p)
    p.send_signal(sig)
    time.sleep(0.05)
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 128 + sig, err
    assert "second" not in err and err.count(f"got {sig.name}") == 1, err
    for rank in (0, 1):
        assert marks(tmp_path, rank) == ["ready", sig.name, "exit"], marks(tmp_path, rank)
    assert wait_gone(launch.token) == []


# ---------------------------------------------------------------------------- 3. subcommands in --help


def test_help_lists_every_subcommand_with_one_line(launch):
    r = launch.run("--help")
    assert r.returncode == 0, r.stderr
    section = r.stdout.split("Subcommands:")[1]
    for name in ("check", "bench allreduce", "store"):
        assert any(line.strip().startswith(name + " ") for line in section.splitlines()), (name, section)


@pytest.mark.parametrize(
    "args",
    [["bench", "--help"], ["bench", "-h"], ["bench", "allreduce", "--help"], ["check", "--help"], ["store", "--help"]],
    ids=" ".join,
)
def test_every_subcommand_has_its_own_help(launch, args):
    r = launch.run(*args)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "usage" in r.stdout.lower(), r.stdout
    if args[1] != "allreduce" and args[0] == "bench":
        assert "allreduce" in r.stdout


# ---------------------------------------------------------------------------- 4. the temporary log folder is named


def temp_folders(text: str) -> set[str]:
    return set(re.findall(r"(/\S*/launcher-[\w.-]+)", text))


def test_redirects_without_log_dir_names_the_temporary_folder(launch, tmp_path):
    r = launch.run(
        "--nproc_per_node",
        "2",
        "--redirects",
        "3",
        worker("exit_code.py"),
        env={"FAIL_RANK": "1", "SLEEP": "5", "TMPDIR": str(tmp_path)},
    )
    assert r.returncode == 3, r.stderr
    lines = r.stderr.splitlines()
    [folder] = temp_folders(r.stderr)
    assert folder.startswith(str(tmp_path)) and os.path.isdir(folder)
    assert "logs in" in lines[0] and folder in lines[0], lines  # named once at the start
    assert any("kept in" in line and folder in line for line in lines[1:]), lines  # and in the summary
    assert open(os.path.join(folder, "attempt_0", "1", "stdout.log")).read() == "out rank=1 restart=0\n"


def test_an_interrupted_run_names_the_folder_it_keeps(launch, tmp_path):
    marks_dir = tmp_path / "marks"
    marks_dir.mkdir()
    p = launch.start(
        "--nproc_per_node",
        "2",
        "--redirects",
        "3",
        worker("signals.py"),
        env={"MARK_DIR": str(marks_dir), "TMPDIR": str(tmp_path)},
    )
    wait_for(all_have(marks_dir, "ready"), what="workers ready", proc=p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    [folder] = temp_folders(err)
    summary = err.split("got SIGINT")[1]
    assert f"kept in {folder}" in summary and "stopped by SIGINT" in summary, err


def test_a_quiet_successful_run_without_files_leaves_no_folder(launch, tmp_path):
    r = launch.run("--nproc_per_node", "2", worker("echo_args.py"), env={"TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert temp_folders(r.stderr) == set() and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- 5. torchrun's unambiguous prefixes


@pytest.mark.parametrize(
    "args",
    [
        ["--nproc_per", "2"],
        ["--nproc-per", "2"],
        ["--nproc_per=2"],
        ["--nproc-p=2"],
        ["--nproc_per", "2", "--max_rest", "1", "--role", "r"],
    ],
    ids=" ".join,
)
def test_unambiguous_prefix_before_the_script_is_accepted(launch, args):
    r = launch.run(*args, worker("echo_args.py"), "--nproc_per", "x")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split("\n"))[1:] == [f"[rank{n}]: rank={n} args=['--nproc_per', 'x']" for n in (0, 1)], (
        r.stdout
    )


@pytest.mark.parametrize(
    "args, hint",
    [
        (["--no", "2"], "--no_live"),  # ambiguous: --no_python, --node_rank, --no_live ...
        (["--nprocs_per_node", "2"], "--nproc_per_node"),  # a typo, not a prefix
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else a,
)
def test_ambiguous_prefix_or_typo_is_one_line_with_a_suggestion(launch, args, hint):
    r = launch.run(*args, worker("echo_args.py"))
    one_line_exit_2(r)
    assert "Did you mean" in r.stderr and hint in r.stderr, r.stderr


# ---------------------------------------------------------------------------- 6. the live view after Ctrl-C


def test_live_view_renders_a_signalled_round_as_stopped_by_the_signal():
    from rich.console import Console

    from launcher.spec import GroupState, Snapshot
    from launcher.view import render

    def shown(snap):
        console = Console(file=io.StringIO(), width=120)
        console.print(render(snap, lambda pid: (None, None), 0.0))
        return console.file.getvalue()

    workers = [{"rank": 0, "local_rank": 0, "pid": 1, "state": "stopped", "started": 0.0, "last_line": ""}]
    assert "stopped by SIGINT" in shown(Snapshot(GroupState.FAILED, 0, 0, workers, signal=signal.SIGINT))
    assert "stopping on SIGTERM" in shown(Snapshot(GroupState.STOPPING, 0, 0, workers, signal=signal.SIGTERM))
    assert "· failed ·" in shown(Snapshot(GroupState.FAILED, 0, 0, workers))


def test_live_table_after_ctrl_c_says_stopped_by_sigint(launch, tmp_path):
    p = launch.start(
        "--live", "--nproc_per_node", "2", worker("signals.py"), env={"MARK_DIR": str(tmp_path), "COLUMNS": "150"}
    )
    wait_for(all_have(tmp_path, "ready"), what="workers ready", proc=p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    final_table = err.split("got SIGINT")[-1]
    assert "round 0 · stopped by SIGINT" in final_table and "· failed ·" not in final_table, err


# ---------------------------------------------------------------------------- 7. bench allreduce -b/-e


def row_sizes(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if re.match(r"\[rank0\]:\s+\d", line)]


@pytest.mark.timeout(120)
def test_bench_allreduce_with_only_b_and_e_doubles_the_size(launch):
    r = launch.run(
        "bench", "allreduce", "--nproc_per_node", "2", "--", "-b", "1K", "-e", "8K", "-w", "0", "-n", "1", timeout=100
    )
    assert r.returncode == 0, r.stderr
    assert row_sizes(r.stdout) == [1024, 2048, 4096, 8192], r.stdout


def test_bench_allreduce_explicit_steps_are_nccl_tests_steps():
    from launcher.allreduce import parser, plan

    def planned(*argv):
        return plan(parser().parse_args(list(argv)))

    assert planned("-b", "1K", "-e", "1M") == [2**k for k in range(10, 21)]
    assert planned("-b", "1K", "-e", "3K", "-i", "1K") == [1024, 2048, 3072]  # -i alone: add it each step
    assert planned("-b", "1K", "-e", "8K", "-f", "4") == [1024, 4096]
    assert planned("-b", "1K", "-e", "3M", "-f", "1") == [1024, 1024 + 2**20, 1024 + 2 * 2**20]  # nccl-tests' -i 1M
    assert planned() == [32 * 2**20]
    assert "factor 2" in parser().format_help()


# ---------------------------------------------------------------------------- 8. setup.sh skips an unchanged install


def fake_checkout(tmp_path):
    """A copy of the scripts and packaging files, with a .venv whose python and pip only log their calls."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("scripts/setup.sh", "setup.cfg", "pyproject.toml"):
        (repo / name).write_text((ROOT / name).read_text())
    (repo / ".venv" / "bin").mkdir(parents=True)
    for tool in ("python", "pip"):
        shim = repo / ".venv" / "bin" / tool
        shim.write_text(f'#!/bin/sh\necho "{tool} $*" >> "$(dirname "$0")/../calls"\n')
        shim.chmod(0o755)
    return repo


def setup_calls(repo, *args) -> list[str]:
    calls = repo / ".venv" / "calls"
    calls.unlink(missing_ok=True)
    subprocess.run(
        ["bash", str(repo / "scripts" / "setup.sh"), *args],
        check=True,
        timeout=30,
        capture_output=True,
        env=dict(os.environ, PYTHON="false"),
    )
    return calls.read_text().splitlines() if calls.exists() else []


def test_setup_skips_reinstalling_an_unchanged_checkout(tmp_path):
    repo = fake_checkout(tmp_path)
    assert any(c.startswith("pip install") and c.endswith("-e .") for c in setup_calls(repo))  # a fresh clone installs
    assert setup_calls(repo) == []  # the second run (demo.sh's) starts at once
    with open(repo / "setup.cfg", "a") as f:
        f.write("\n# a new dependency\n")
    assert any(c.startswith("pip install") for c in setup_calls(repo))  # packaging changed: install again
    assert setup_calls(repo) == []
    (repo / ".venv" / ".launcher-installed").write_text("stale\n")  # e.g. a venv of another checkout
    assert any(c.startswith("pip install") for c in setup_calls(repo))


# ------------------------------------------------------------ 9. the launcher's own TORCHELASTIC_ERROR_FILE

TORCH_RECORD_WORKER = """
import os, sys, time
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    with open(os.path.join(os.environ["MARK_DIR"], os.environ["RANK"]), "w") as f:
        f.write(os.environ["TORCHELASTIC_ERROR_FILE"])
    if os.environ["RANK"] == "1":
        raise ValueError("bad learning rate -1")
    time.sleep(30)

main()
"""


@pytest.mark.timeout(90)
def test_root_cause_error_file_is_copied_to_the_launchers_own(launch, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCH_RECORD_WORKER)
    parent = tmp_path / "scheduler" / "error.json"
    parent.parent.mkdir()
    parent.write_text("left over from an earlier run")
    r = launch.run(
        "--nproc_per_node",
        "2",
        str(script),
        timeout=80,
        env={"MARK_DIR": str(tmp_path), "TORCHELASTIC_ERROR_FILE": str(parent)},
    )
    assert r.returncode == 1, r.stderr
    own = [(tmp_path / str(rank)).read_text() for rank in (0, 1)]
    assert str(parent) not in own and own[0] != own[1]  # every worker still has its own file
    data = json.loads(parent.read_text())
    assert data["message"]["message"] == "ValueError: bad learning rate -1"
    assert data["message"]["errorCode"] == 1  # torchrun's dump_error_file sets the exit code
    assert "in main" in data["message"]["extraInfo"]["py_callstack"]
    assert (
        data["message"]["extraInfo"]["timestamp"]
        == json.loads(open(own[1]).read())["message"]["extraInfo"]["timestamp"]
    )


def test_no_error_file_is_written_without_a_root_cause_error_file(launch, tmp_path):
    parent = tmp_path / "error.json"
    r = launch.run(
        "--nproc_per_node", "2", worker("exit_code.py"), env={"FAIL_RANK": "0", "TORCHELASTIC_ERROR_FILE": str(parent)}
    )
    assert r.returncode == 3, r.stderr
    assert not parent.exists()  # as torchrun: nothing to copy
    r = launch.run("--nproc_per_node", "1", worker("echo_args.py"), env={"TORCHELASTIC_ERROR_FILE": str(parent)})
    assert r.returncode == 0 and not parent.exists(), r.stderr


def test_an_unwritable_launcher_error_file_is_one_line_and_keeps_the_exit_code(launch, tmp_path):
    dest = tmp_path / "no-such-folder" / "error.json"
    r = launch.run("--nproc_per_node", "1", worker("record_error.py"), env={"TORCHELASTIC_ERROR_FILE": str(dest)})
    assert r.returncode == 1, r.stderr
    assert "launcher/run.py" not in r.stderr and "FileNotFoundError" not in r.stderr, r.stderr  # no traceback of ours
    assert sum(f"TORCHELASTIC_ERROR_FILE={dest}" in line for line in r.stderr.splitlines()) == 1, r.stderr


# ---------------------------------------------------------------------------- 11. SIGKILL is not always the OOM killer


def test_sigkill_from_outside_is_not_called_out_of_memory(launch):
    r = launch.run("--nproc_per_node", "2", worker("kill_self.py"))
    assert r.returncode == 1, r.stderr
    root = next(line for line in r.stderr.splitlines() if "root cause:" in line)
    assert "killed by SIGKILL" in root and "memory" not in root.lower(), root


@pytest.mark.parametrize("version", [1, 2])
def test_oom_kill_count_is_read_from_the_cgroup(tmp_path, version):
    from launcher.oom import oom_kills

    proc = tmp_path / "cgroup"
    root = tmp_path / "sys"
    if version == 2:
        proc.write_text("0::/job/step\n")
        (root / "job" / "step").mkdir(parents=True)
        (root / "job" / "step" / "memory.events").write_text(
            "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n"
        )
    else:
        proc.write_text("5:devices:/\n4:memory:/job/step\n0::/\n")
        (root / "memory" / "job" / "step").mkdir(parents=True)
        (root / "memory" / "job" / "step" / "memory.oom_control").write_text(
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
        )
    assert oom_kills(str(proc), str(root)) == 2
    assert oom_kills(str(tmp_path / "missing"), str(root)) is None
    assert isinstance(oom_kills(), (int, type(None)))  # this machine's own, whatever it has


def memory_cgroup_of_our_own():
    """A child cgroup v2 with the memory controller, under ours; None where none can be made."""
    try:
        ours = open("/proc/self/cgroup").read().split("0::", 1)[1].split("\n")[0]
    except (OSError, IndexError):
        return None
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        parent = mount + ours.rstrip("/")
        try:
            if "memory" not in open(parent + "/cgroup.subtree_control").read().split():
                continue
            child = f"{parent}/launcher-oom-{os.getpid()}"
            os.mkdir(child)
            return child
        except OSError:
            continue
    return None


OOM_WORKER = "import os, time\nif os.environ['RANK'] == '0':\n    b = bytearray(1 << 30)\ntime.sleep(30)\n"


@pytest.mark.timeout(60)
def test_a_real_oom_kill_is_called_out_of_memory(launch, tmp_path):
    child = memory_cgroup_of_our_own()
    if child is None:
        pytest.skip("no cgroup v2 with the memory controller delegated here to make a small one")
    try:
        open(f"{child}/memory.max", "w").write(str(200 << 20))
        open(f"{child}/memory.swap.max", "w").write("0")
        script = tmp_path / "hog.py"
        script.write_text(OOM_WORKER)
        r = subprocess.run(
            [
                "sh",
                "-c",
                f'echo $$ > {child}/cgroup.procs && exec "$@"',
                "sh",
                *LAUNCHER,
                "--nproc_per_node",
                "2",
                str(script),
            ],
            capture_output=True,
            text=True,
            timeout=50,
            env=launch.env(),
        )
        root = next(line for line in r.stderr.splitlines() if "root cause:" in line)
        assert "killed by SIGKILL" in root and "out of memory" in root, r.stderr
    finally:
        assert wait_gone(launch.token) == []
        os.rmdir(child)


# ---------------------------------------------------------------------------- 10. the agent serves the bootstrap store


def worker_lines(stdout: str) -> list[str]:
    return sorted(line.split(": ", 1)[1] for line in stdout.splitlines() if line.startswith("[rank"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["standalone", "static"])
def test_every_rank_a_store_client_works_and_each_round_has_a_fresh_store(launch, backend):
    same_port = ["--rdzv_backend", "static", "--master_port", str(free_port())] if backend == "static" else []
    r = launch.run(
        *same_port,
        "--nproc_per_node",
        "2",
        "--max_restarts",
        "1",
        worker("agent_store.py"),
        env={"MODE": "client", "FAIL_RANK": "1", "STORE_TIMEOUT": "15"},
        timeout=100,
    )
    assert r.returncode == 0, r.stderr
    assert worker_lines(r.stdout) == [
        f"rank={k} round={n} sum=3 agent_store=True stale=False" for k in (0, 1) for n in (0, 1)
    ]
    assert wait_gone(launch.token) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "disable, expect", [("", "True"), ("1", "False")], ids=["agent", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"]
)
def test_init_process_group_env_follows_the_contract(launch, disable, expect):
    r = launch.run(
        "--nproc_per_node",
        "2",
        worker("agent_store.py"),
        env={"MODE": "env", "STORE_TIMEOUT": "15", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": disable},
        timeout=100,
    )
    assert r.returncode == 0, r.stderr
    assert worker_lines(r.stdout) == [f"rank={k} round=0 sum=3 agent_store={expect} stale=False" for k in (0, 1)]
