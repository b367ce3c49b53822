"""The worker environment, built by one pure function from the config, the round and the worker:
torchrun's whole contract, the agent's secrets kept out, the thread and GPU rules, the legacy
--local-rank argument, and the zygote's environment as a worker's less what differs per worker."""

from __future__ import annotations

import signal

import pytest

from launcher.agent.env import AGENT_ID_VAR, PROGRESS_VAR, worker_argv, worker_env, workers_of, zygote_env
from launcher.agent.members import worker_spec
from launcher.config import JOIN_TOKEN_ENV, LaunchConfig
from launcher.spec import Round, Worker

ROUND = Round(
    run_id="job",
    round=2,
    restart_count=1,
    group_rank=1,
    group_world_size=2,
    rank_offset=4,
    world_size=8,
    master_addr="node0",
    master_port=29500,
)


def config(**kw) -> LaunchConfig:
    return LaunchConfig(
        program=("python", "-u", "train.py"),
        nproc_per_node=4,
        signals_to_handle=(signal.SIGTERM, signal.SIGUSR1),
        max_restarts=3,
        **kw,
    )


def env_of(cfg: LaunchConfig | None = None, local_rank: int = 1, base: dict | None = None, **kw) -> dict[str, str]:
    worker = workers_of(ROUND, 4)[local_rank]
    return worker_env(
        worker_spec(cfg or config()), ROUND, worker, base or {}, error_file="/tmp/err.json", agent_id="a1", **kw
    )


def test_workers_of_a_round_take_the_nodes_offset():
    assert workers_of(ROUND, 4) == [
        Worker(local_rank=i, rank=4 + i, local_world_size=4, world_size=8) for i in range(4)
    ]


def test_every_variable_of_torchruns_contract():
    env = env_of()
    assert {k: env[k] for k in env if k != "OMP_NUM_THREADS"} == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "5",
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": "8",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "job",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/tmp/err.json",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGUSR1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "LAUNCHER_ROUND": "2",
        AGENT_ID_VAR: "a1",
    }


def test_the_agents_secrets_and_systemd_stay_with_the_agent():
    base = {
        "PATH": "/bin",
        "NOTIFY_SOCKET": "/run/x",
        "WATCHDOG_USEC": "1",
        "WATCHDOG_PID": "2",
        JOIN_TOKEN_ENV: "s3cret",
    }
    env = env_of(base=base)
    assert env["PATH"] == "/bin"
    assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", JOIN_TOKEN_ENV} & env.keys()
    zygote = zygote_env(config().nproc_per_node, base, agent_id="a1")
    assert not {"NOTIFY_SOCKET", JOIN_TOKEN_ENV} & zygote.keys() and zygote[AGENT_ID_VAR] == "a1"


def test_omp_threads_default_to_one_with_several_workers_and_the_users_value_wins():
    assert env_of()["OMP_NUM_THREADS"] == "1"
    assert env_of(base={"OMP_NUM_THREADS": "8"})["OMP_NUM_THREADS"] == "8"
    assert "OMP_NUM_THREADS" not in worker_env(
        worker_spec(config()), ROUND, Worker(0, 0, 1, 1), {}, error_file="e", agent_id="a"
    )  # one worker: torch's own default
    assert (
        zygote_env(config().nproc_per_node, {}, agent_id="a")["OMP_NUM_THREADS"] == "1"
    )  # what a forked worker inherits


def test_the_users_nccl_setting_passes_through():
    assert env_of(base={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def test_gpus_select_devices_and_virtual_local_rank_gives_each_worker_one():
    env = env_of(config(gpus=("2", "3", "5", "7")))
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3,5,7" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    virtual = env_of(config(gpus=("2", "3", "5", "7"), virtual_local_rank=True), local_rank=2)
    assert virtual["CUDA_VISIBLE_DEVICES"] == "5" and virtual["LOCAL_RANK"] == "0"
    no_list = env_of(config(virtual_local_rank=True), local_rank=3, base={"CUDA_VISIBLE_DEVICES": "0"})
    assert no_list["CUDA_VISIBLE_DEVICES"] == "3"  # fewer visible than workers: its own local rank


def test_progress_file_and_hang_timeout():
    assert PROGRESS_VAR not in env_of()
    assert env_of(progress_file="/tmp/p")[PROGRESS_VAR] == "/tmp/p"
    assert "PYTHONFAULTHANDLER" not in env_of()
    assert env_of(config(hang_timeout=60.0))["PYTHONFAULTHANDLER"] == "1"


@pytest.mark.parametrize(
    "base, ifname, nodes, expect",
    [
        ({}, "eth1", 2, "eth1"),
        ({"GLOO_SOCKET_IFNAME": "ib0"}, "eth1", 2, "ib0"),  # the user's choice stays
        ({}, "eth1", 1, None),  # one node: nothing to reach
        ({}, None, 2, None),
    ],
)
def test_gloo_binds_the_interface_the_peers_are_reached_through(base, ifname, nodes, expect):
    from dataclasses import replace

    rnd = replace(ROUND, ifname=ifname, group_world_size=nodes, group_rank=0)
    env = worker_env(worker_spec(config()), rnd, Worker(0, 0, 4, 8), base, error_file="e", agent_id="a")
    assert env.get("GLOO_SOCKET_IFNAME") == expect


def test_argv_with_the_legacy_local_rank_argument():
    w = Worker(local_rank=2, rank=6, local_world_size=4, world_size=8)
    assert worker_argv(worker_spec(config(script_args=("--lr", "1"))), w) == ["python", "-u", "train.py", "--lr", "1"]
    legacy = config(script_args=("--lr", "1"), local_rank_arg="--local-rank")
    assert worker_argv(worker_spec(legacy), w) == ["python", "-u", "train.py", "--local-rank=2", "--lr", "1"]
