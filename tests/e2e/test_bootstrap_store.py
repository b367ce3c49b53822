"""The agent serves the workers' bootstrap store: every rank's store client works, each round gets a
fresh store, and init_process_group's env:// follows torch's contract."""

from __future__ import annotations

import pytest
from support.paths import worker
from support.ports import free_port
from support.processes import wait_gone


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
