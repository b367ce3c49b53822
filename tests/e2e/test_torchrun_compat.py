"""torchrun command lines run unchanged, side by side with torchrun where it runs here (issue 24):
the expectation of each test is what torchrun does with the same line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"
needs_torchrun = pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this python")


def run(tool: str, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 90):
    """`launcher` or `torchrun` with `args`; PET_ variables of the caller's environment left out."""
    cmd = [sys.executable, "-m", "launcher"] if tool == "launcher" else [str(TORCHRUN)]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), (env or {}).get("PYTHONPATH", "")]))
    full = {**base, **{k: v for k, v in (env or {}).items() if k != "PYTHONPATH"}}
    return subprocess.run([*cmd, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "hello.py").write_text(
        textwrap.dedent(
            """\
            import os, sys
            print("creating", os.environ["RANK"], flush=True)
            print("loss 0.5 at rank", os.environ["RANK"], flush=True)
            print("warn NEEDLE", os.environ["RANK"], file=sys.stderr, flush=True)
            """
        )
    )
    return tmp_path


def ranks_said(out: str, pattern: str) -> set[str]:
    return set(re.findall(pattern, out, re.M))


@needs_torchrun
def test_log_line_prefix_template_used_as_given(here):
    env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}
    args = ("--nproc-per-node=2", "--tee=3", "--redirects=3", "hello.py")
    ours, theirs = run("launcher", *args, cwd=here, env=env), run("torchrun", *args, cwd=here, env=env)
    assert ours.returncode == theirs.returncode == 0, ours.stderr + theirs.stderr
    for r in (ours, theirs):
        assert ranks_said(r.stdout, r"^\[rank(\d)\]: creating \1$") == {"0", "1"}, r.stdout
    assert ": :" not in ours.stdout


@needs_torchrun
def test_rdzv_conf_with_its_quotes_in_argv(here):
    args = (
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=localhost:{free_port()}",
        "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
        "hello.py",
    )
    ours = run("launcher", *args, cwd=here)
    theirs = run("torchrun", *[a.replace(args[3], f"--rdzv-endpoint=localhost:{free_port()}") for a in args], cwd=here)
    assert ours.returncode == theirs.returncode == 0, ours.stderr + theirs.stderr
    assert "rdzv_conf" not in ours.stderr  # every key known once the quotes are off: nothing to say


@needs_torchrun
def test_pet_module(here):
    # one write per line: two ranks share the pipe, and an unbuffered print writes each piece apart
    (here / "modjob.py").write_text("import os\nos.write(1, f\"module {__name__} {os.environ['RANK']}\\n\".encode())\n")
    env = {"PET_MODULE": "1", "PET_NPROC_PER_NODE": "2"}
    ours, theirs = run("launcher", "modjob", cwd=here, env=env), run("torchrun", "modjob", cwd=here, env=env)
    for r in (ours, theirs):
        assert r.returncode == 0, r.stderr
        assert ranks_said(r.stdout, r"module __main__ (\d)$") == {"0", "1"}, r.stdout
    both = {"PET_MODULE": "1", "PET_NO_PYTHON": "1"}
    ours, theirs = run("launcher", "modjob", cwd=here, env=both), run("torchrun", "modjob", cwd=here, env=both)
    assert theirs.returncode != 0 and "--no-python" in theirs.stderr  # torch: ValueError
    assert ours.returncode == 2 and ours.stderr.strip().endswith("-m and --no_python cannot be combined; pick one")


@needs_torchrun
@pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset")
@pytest.mark.parametrize("nproc", ["auto", "cpu"])
def test_nproc_counts_the_cpus_this_process_may_use(here, nproc):
    args = ("taskset", "-c", "0")
    for tool in ("launcher", "torchrun"):
        cmd = [sys.executable, "-m", "launcher"] if tool == "launcher" else [str(TORCHRUN)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
        env.update(PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
        r = subprocess.run(
            [*args, *cmd, f"--nproc-per-node={nproc}", "hello.py"],
            cwd=here,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert r.returncode == 0, r.stderr
        assert ranks_said(r.stdout, r"creating (\d+)$") == {"0"}, (tool, r.stdout)


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    """A package registering a torchrun.logs_specs class, installed by a dist-info folder on PYTHONPATH."""
    site = tmp_path / "site"
    (site / "flat_logs-0.1.dist-info").mkdir(parents=True)
    (site / "flat_logs-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: flat-logs\nVersion: 0.1\n")
    (site / "flat_logs-0.1.dist-info" / "entry_points.txt").write_text(
        "[torchrun.logs_specs]\nflat = flat_logs:FlatLogs\n"
    )
    (site / "flat_logs.py").write_text(
        textwrap.dedent(
            """\
            import os
            from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

            class FlatLogs(DefaultLogsSpecs):
                '''Every rank's stdout in <log_dir>/flat_<rank>.out.'''

                def reify(self, envs):
                    dest = super().reify(envs)
                    for r in dest.stdouts:
                        if dest.stdouts[r]:
                            dest.stdouts[r] = os.path.join(self.root_log_dir, f"flat_{r}.out")
                    return dest
            """
        )
    )
    return site


@needs_torchrun
def test_logs_specs_default_and_a_plugin(here, plugin):
    for tool in ("launcher", "torchrun"):
        logs = here / f"logs_{tool}"
        default = run(tool, "--nproc-per-node=1", "--logs-specs=default", "hello.py", cwd=here)
        assert default.returncode == 0, default.stderr
        args = ("--nproc-per-node=2", "--redirects=1", f"--log-dir={logs}", "--logs_specs=flat", "hello.py")
        r = run(tool, *args, cwd=here, env={"PYTHONPATH": str(plugin)})
        assert r.returncode == 0, r.stderr
        assert sorted(p.name for p in logs.glob("flat_*.out")) == ["flat_0.out", "flat_1.out"], tool
        assert "creating 1" in (logs / "flat_1.out").read_text()
        missing = run(tool, "--logs_specs=DOESNOT_EXIST", "hello.py", cwd=here)
        assert missing.returncode != 0 and "DOESNOT_EXIST" in missing.stderr  # torch: ValueError
        if tool == "launcher":
            assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_logs_specs_default_does_not_import_torch():
    code = (
        "import sys, launcher.config as c; "
        "c.from_flags(training_script='true', no_python=True, logs_specs='default'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


@needs_torchrun
def test_duplicate_filters(here):
    for tool in ("launcher", "torchrun"):
        logs = here / f"dup_{tool}"
        args = (
            "--nproc-per-node=2",
            "--tee=3",
            f"--log-dir={logs}",
            "--duplicate-stdout-filters=loss",
            "--duplicate_stderr_filters=NEEDLE",
            "hello.py",
        )
        r = run(tool, *args, cwd=here)
        assert r.returncode == 0, r.stderr
        (out,) = logs.glob("*/attempt_0/filtered_stdout.log")
        (err,) = logs.glob("*/attempt_0/filtered_stderr.log")
        assert ranks_said(out.read_text(), r"loss 0.5 at rank (\d)$") == {"0", "1"}, tool
        assert "creating" not in out.read_text()
        assert ranks_said(err.read_text(), r"warn NEEDLE (\d)$") == {"0", "1"}, tool


def test_event_log_handler_console(here):
    r = run("launcher", "--event_log_handler=console", "hello.py", cwd=here)
    assert r.returncode == 0, r.stderr
    assert re.search(r"launcher: event spawn rank=0 local_rank=0 pid=\d+", r.stderr), r.stderr
    assert re.search(r"launcher: event finished state=succeeded exit_code=0", r.stderr), r.stderr


TIMED = """\
import os, time
from torch.distributed.elastic.timer import FileTimerClient, configure, expires
configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
with expires(after=1, scope="fast"):
    pass
if os.environ["RANK"] == "1":
    while not os.path.exists("rank0.done"):  # rank 0's line first, however slow its start on a busy host
        time.sleep(0.05)
    with expires(after=1, scope="stuck_step"):
        time.sleep(60)
print("rank", os.environ["RANK"], "done", flush=True)
if os.environ["RANK"] == "0":
    open("rank0.done", "w").close()
"""


@needs_torchrun
def test_file_timer_watchdog_ends_the_worker_like_a_failure(here):
    """torchrun's agent SIGKILLs the worker whose timer expired (and then itself); ours ends that worker and
    reports it as the job's failure, naming the timer's scope."""
    (here / "timed.py").write_text(TIMED)
    env = {"TORCHELASTIC_ENABLE_FILE_TIMER": "1", "TORCHELASTIC_TIMER_FILE": str(here / "pipe")}
    theirs = run("torchrun", "--nproc-per-node=2", "timed.py", cwd=here, env=env)
    assert "rank 0 done" in theirs.stdout and "rank 1 done" not in theirs.stdout and theirs.returncode != 0
    (here / "rank0.done").unlink()
    ours = run("launcher", "--nproc-per-node=2", "timed.py", cwd=here, env={**env, "TORCHELASTIC_TIMER_FILE": ""})
    assert "rank 0 done" in ours.stdout and "rank 1 done" not in ours.stdout and ours.returncode == 1
    assert re.search(r"root cause: rank 1 .* was ended by its watchdog: timer 'stuck_step' expired", ours.stderr)
    made = re.search(r"file-timer watchdog on (\S+)", ours.stderr).group(1)
    assert not os.path.exists(made)  # the pipe it made is gone


@pytest.fixture
def handler_plugin(tmp_path: Path) -> Path:
    """A torchrun.handlers backend `wrapped_static`: torch's own static handler behind the entry point."""
    site = tmp_path / "handlers"
    info = site / "wrapped_static-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wrapped-static\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torchrun.handlers]\nwrapped_static = wrapped_static:get_handler\n")
    (site / "wrapped_static.py").write_text(
        textwrap.dedent(
            """\
            from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import create_rdzv_handler


            def create(params):
                params.config["rank"] = int(params.config["rank"])  # torchrun passes --node_rank as an int
                handler = create_rdzv_handler(params)
                handler.get_backend = lambda: "wrapped_static"  # torch's registry checks the name
                return handler


            def get_handler():
                return create
            """
        )
    )
    return site


ENV_DUMP = """\
import os, pathlib
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
line = "env " + " ".join(f"{k}={os.environ[k]}" for k in keys)
pathlib.Path(os.environ["DUMP_DIR"], os.environ["RANK"]).write_text(line)
"""


@needs_torchrun
def test_torchrun_handlers_plugin_drives_the_job(here, handler_plugin):
    """Two nodes of 2 workers meet through a third-party rendezvous backend; the workers see what
    torchrun's workers see with the same backend."""
    (here / "env_dump.py").write_text(ENV_DUMP)

    def job(tool: str, **extra: str) -> set[str]:
        port = free_port()
        cmd = [sys.executable, "-m", "launcher"] if tool == "launcher" else [str(TORCHRUN)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
        env["PYTHONPATH"] = os.pathsep.join([str(handler_plugin), str(ROOT)])
        env.update(extra)
        # each worker writes its own file: what the tools print around a worker's line is not compared
        dump = here / f"dump-{tool}-{len(list(here.glob('dump-*')))}"
        dump.mkdir()
        env["DUMP_DIR"] = str(dump)
        nodes = [
            subprocess.Popen(
                [
                    *cmd,
                    "--nnodes=2",
                    "--nproc-per-node=2",
                    "--rdzv-backend=wrapped_static",
                    f"--rdzv-endpoint=127.0.0.1:{port}",
                    f"--rdzv-conf=rank={rank}",
                    "--rdzv-id=plugjob",
                    "env_dump.py",
                ],
                cwd=here,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in (0, 1)
        ]
        try:
            outs = [p.communicate(timeout=120) for p in nodes]
        finally:
            for p in nodes:
                p.kill()
                p.wait()
        assert all(p.returncode == 0 for p in nodes), [err for _, err in outs]
        return {f.read_text() for f in dump.iterdir()}

    ours, theirs = job("launcher"), job("torchrun")
    assert len(ours) == 4 and ours == theirs, (ours, theirs)
    # the same ranks from the group rank alone, without the store round trip (as torch's agent)
    assert job("launcher", TORCH_ELASTIC_WORKER_IDENTICAL="1") == theirs
