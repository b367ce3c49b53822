"""Launcher runs on the c10d backend's store: the agent imports no torch (its own pure-Python
TCPStore client and server), and agents meet on a store that torch hosts."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from support.paths import worker
from support.ports import free_port
from support.tcpstore import torch_store_server


@pytest.fixture(scope="module")
def torch_libuv():
    """torch's default TCPStore server in a subprocess -> (kind, port)."""
    yield from torch_store_server("libuv")


def fresh() -> str:
    return uuid.uuid4().hex[:8] + "/"


def test_a_launcher_run_on_c10d_imports_no_torch_in_the_agent(launch, tmp_path):
    args = [
        "--nnodes",
        "1",
        "--nproc_per_node",
        "1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv_id",
        "imports",
        worker("node_info.py"),
    ]
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "launcher", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=launch.env(),
        cwd=tmp_path,
    )  # -X importtime: the agent only, not its workers
    assert r.returncode == 0, r.stderr[-3000:]
    imported = [line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    # the c10d path ran (tcpstore's modules load through its lazy __getattr__, which -X importtime does not list)
    assert "launcher.rendezvous.c10d" in imported
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]


def test_agents_meet_on_a_store_hosted_by_torch(launch, torch_libuv):
    port = torch_libuv[1]
    args = [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--rdzv_id",
        fresh().rstrip("/"),
        "--rdzv_conf",
        "is_host=false",
        worker("node_info.py"),
    ]
    procs = [launch.start(*args, env={"SLEEP": "0.2"}) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    ranks = sorted(
        line.split("rank=")[1].split()[0] for out, _ in outs for line in out.splitlines() if " info " in line
    )
    assert ranks == ["0", "1"], outs
