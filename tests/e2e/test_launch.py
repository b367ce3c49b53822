"""Launch: the CLI, the worker environment contract against torchrun, static multi-node, entry modes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from support.paths import ROOT, worker
from support.ports import free_port

BAD_INPUT = [
    (["--nproc_per_node", "0", "x.py"], "--nproc_per_node"),
    (["--nproc_per_node", "many", "x.py"], "--nproc_per_node"),
    (["--nnodes", "3:2", "x.py"], "--nnodes"),
    (["--nnodes", "a:b", "x.py"], "--nnodes"),
    (["--nnodes", "2", "--node_rank", "5", "x.py"], "--node_rank"),
    (["--nproc_per_node", "2"], "missing the training script"),
    (["--nproc_per_node", "2", "no_such_script.py"], "does not exist"),
    (["--nnodes", "2", "--rdzv_endpoint", "host:99999", "x.py"], "--rdzv_endpoint"),
    (["--nnodes", "2", "--master_port", "http", "x.py"], "--master_port"),
    (["--max_restarts", "-1", "x.py"], "--max_restarts"),
    (["--redirects", "7", "x.py"], "--redirects"),
    (["--local_ranks_filter", "a,b", "x.py"], "--local_ranks_filter"),
    (["--signals_to_handle", "SIGFOO", "x.py"], "SIGFOO"),
    (["--rdzv_backend", "zookeeper", "x.py"], "--rdzv_backend"),
    (["--rdzv_conf", "novalue", "x.py"], "--rdzv_conf"),
    (["--numa_binding", "cores", "x.py"], "--numa_binding"),
    (["-m", "--no_python", "x"], "-m and --no_python"),
    (["--shutdown_timeout", "soon", "x.py"], "--shutdown_timeout"),
    (["--no-such-flag", "x.py"], "no-such-flag"),
]


@pytest.mark.parametrize("args,needle", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(launch, tmp_path, args, needle):
    (tmp_path / "x.py").write_text("")
    r = launch.run(*args, cwd=str(tmp_path), timeout=30)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("launcher: error: ") and needle in lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("spelling", ["--help", "-h"])  # -h as torchrun and the subcommands take it (issue 34)
def test_help_and_version(launch, spelling):
    r = launch.run(spelling, timeout=30)
    assert r.returncode == 0 and "Examples:" in r.stdout and "--nproc_per_node" in r.stdout
    assert "Rendezvous:" in r.stdout and "Slurm" in r.stdout
    v = launch.run("--version", timeout=30)
    assert v.returncode == 0 and v.stdout.startswith("launcher ")


def test_agent_does_not_import_torch():
    code = (
        "import sys, launcher.cli.commands, launcher.cli.run, launcher.agent.supervisor; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize(
    "spelling",
    [["--nproc_per_node", "3"], ["--nproc-per-node", "3"], ["--nproc_per_node=3"], ["--nproc-per-node=3"]],
)
def test_both_spellings(launch, spelling):
    r = launch.run(*spelling, worker("echo_args.py"), timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(l.split()[0] for l in r.stdout.splitlines()) == ["[rank0]:", "[rank1]:", "[rank2]:"]


def test_pet_environment_defaults(launch):
    r = launch.run(worker("echo_args.py"), env={"PET_NPROC_PER_NODE": "2"}, timeout=60)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2
    r = launch.run("--nproc_per_node", "1", worker("echo_args.py"), env={"PET_NPROC_PER_NODE": "2"}, timeout=60)
    assert len(r.stdout.splitlines()) == 1  # the command line wins over PET_*


def test_script_arguments_pass_through_untouched(launch):
    args = ["--nproc_per_node", "5", "--max", "1", "-m", "x", "--help", "-h", "--", "--rdzv_conf=a=b"]
    r = launch.run("--nproc_per_node", "1", worker("echo_args.py"), *args, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"[rank0]: rank=0 args={args}"


def test_module_mode(launch):
    r = launch.run(
        "--nproc_per_node",
        "2",
        "-m",
        "pkg.hello",
        "--lr",
        "1",
        env={"PYTHONPATH": str(ROOT / "tests" / "workers")},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "module rank=1 args=['--lr', '1']" in r.stdout


def test_no_python_mode(launch):
    r = launch.run("--nproc_per_node", "2", "--no_python", "sh", "-c", "echo sh-rank=$RANK", timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted(["[rank0]:", "sh-rank=0", "[rank1]:", "sh-rank=1"])


def test_legacy_local_rank_argument(launch):
    r = launch.run("--nproc_per_node", "2", "--append_local_rank", worker("echo_args.py"), "x", timeout=60)
    assert "rank=1 args=['--local-rank=1', 'x']" in r.stdout
    r = launch.run("--append_local_rank_as", "--local_rank", worker("echo_args.py"), timeout=60)
    assert "args=['--local_rank=0']" in r.stdout
    legacy = subprocess.run(
        [sys.executable, "-m", "launcher.launch", "--nproc_per_node", "1", worker("echo_args.py"), "y"],
        capture_output=True,
        text=True,
        timeout=60,
        env=launch.env(),
    )
    assert "args=['--local-rank=0', 'y']" in legacy.stdout


def _dump(cmd: list[str], dump_dir, env) -> dict[int, dict]:
    dump_dir.mkdir()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**env, "DUMP_DIR": str(dump_dir)})
    assert r.returncode == 0, r.stderr
    return {int(p.stem): json.loads(p.read_text()) for p in dump_dir.glob("*.json")}


# What may differ, and why: ports and ids are fresh per run; the error-file folder has our name;
# MASTER_ADDR is loopback on one node (torchrun uses the FQDN, which needs working DNS).
INTENDED = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR", "_"}
# LAUNCHER_INPLACE_SLOTS: the workers' folder in memory, where a `Job` script's kept state is copied (docs/memory.md)
OURS_ONLY = {"LAUNCHER_AGENT_ID", "LAUNCHER_ROUND", "LAUNCHER_PROGRESS_FILE", "LAUNCHER_INPLACE_SLOTS"}


@pytest.mark.skipif(not shutil.which("torchrun", path=os.path.dirname(sys.executable)), reason="torchrun not installed")
def test_environment_matches_torchrun(launch, tmp_path):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    args = ["--nproc_per_node", "2", "--max_restarts", "2", worker("dump_env.py"), "a", "--b"]
    theirs = _dump([torchrun, *args], tmp_path / "torchrun", launch.env())
    ours = _dump([sys.executable, "-m", "launcher", *args], tmp_path / "launcher", launch.env())
    assert sorted(theirs) == sorted(ours) == [0, 1]
    for rank in (0, 1):
        t, o = theirs[rank]["env"], ours[rank]["env"]
        assert set(o) - set(t) == OURS_ONLY
        assert set(t) - set(o) == set()
        for key in set(t) - INTENDED - {"DUMP_DIR"}:
            assert o[key] == t[key], key
        assert o["TORCHELASTIC_USE_AGENT_STORE"] == t["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the agent serves it
        assert o["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{rank}/error.json")
        assert o["MASTER_ADDR"] == "127.0.0.1" and o["MASTER_PORT"].isdigit()
        assert theirs[rank]["argv"] == ours[rank]["argv"] == ["a", "--b"]
    assert ours[0]["env"]["MASTER_PORT"] == ours[1]["env"]["MASTER_PORT"]
    assert ours[0]["env"]["TORCHELASTIC_RUN_ID"] == ours[1]["env"]["TORCHELASTIC_RUN_ID"]


def test_omp_rule_and_user_values_pass_through(launch, tmp_path):
    ours = _dump(
        [sys.executable, "-m", "launcher", "--nproc_per_node", "2", worker("dump_env.py")], tmp_path / "a", launch.env()
    )
    assert ours[0]["env"]["OMP_NUM_THREADS"] == "1"
    env = {**launch.env(), "OMP_NUM_THREADS": "7", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    ours = _dump(
        [sys.executable, "-m", "launcher", "--nproc_per_node", "2", worker("dump_env.py")], tmp_path / "b", env
    )
    assert ours[1]["env"]["OMP_NUM_THREADS"] == "7"
    assert ours[1]["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


# Forked from each node's zygote (torch and DDP imported once a node, not once a worker: 9 CPU-s, not
# 16); the seed-style DDP script on one node alone was a strict part of this (same script, 2 workers).
@pytest.mark.parametrize("workers_from", ["preload"], indirect=True)
def test_static_two_nodes_on_one_host(launch):
    port = str(free_port())
    nodes = [
        launch.start(
            "--nnodes",
            "2",
            "--node_rank",
            str(r),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            port,
            "--nproc_per_node",
            "2",
            worker("ddp_seed.py"),
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in nodes]
    for p, (_, err) in zip(nodes, outs):
        assert p.returncode == 0, err
    everything = outs[0][0] + outs[1][0]
    for rank in range(4):
        assert f"ok rank={rank} world=4 sum=6" in everything
    assert "ok rank=2" in outs[1][0] and "ok rank=0" in outs[0][0]  # ranks = node rank x nproc + local rank
