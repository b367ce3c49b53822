"""The worker environment: torch's whole contract, built by one pure function."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass

from ..config import JOIN_TOKEN_ENV
from ..rendezvous.settings import ETCD_PASSWORD_ENV
from ..spec import AGENT_ID_VAR, Round, Worker

PROGRESS_VAR = (
    "LAUNCHER_PROGRESS_FILE"  # touched by launcher.progress(step=), watched with --hang_timeout, read for step rates
)
# systemd talks to the agent alone; the join token and the etcd password are the agent's secrets
AGENT_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", JOIN_TOKEN_ENV, ETCD_PASSWORD_ENV)


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker of this agent shares: its command line and the settings of its environment."""

    program: tuple[str, ...]  # interpreter, flags and script (or the --no_python command)
    script_args: tuple[str, ...] = ()
    local_rank_arg: str | None = None  # e.g. "--local-rank": appended as torch.distributed.launch did
    role: str = "default"
    max_restarts: int = 0
    signals_to_handle: tuple[int, ...] = ()
    gpus: tuple[str, ...] = ()  # physical GPU ids; local rank i uses gpus[i]
    virtual_local_rank: bool = False
    hang_timeout: float | None = None


def worker_env(
    spec: WorkerSpec,
    rnd: Round,
    worker: Worker,
    base: Mapping[str, str],
    *,
    error_file: str,
    agent_id: str,
    progress_file: str | None = None,
) -> dict[str, str]:
    """Everything torchrun sets for a worker, over a copy of `base` (the agent's environment)."""
    env = {k: v for k, v in base.items() if k not in AGENT_ONLY}
    if spec.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.gpus)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # ids mean what nvidia-smi shows
    env.update(
        RANK=str(worker.rank),
        LOCAL_RANK=str(0 if spec.virtual_local_rank else worker.local_rank),
        WORLD_SIZE=str(worker.world_size),
        LOCAL_WORLD_SIZE=str(worker.local_world_size),
        GROUP_RANK=str(rnd.group_rank),
        GROUP_WORLD_SIZE=str(rnd.group_world_size),
        ROLE_RANK=str(worker.role_rank),
        ROLE_NAME=spec.role,
        ROLE_WORLD_SIZE=str(worker.world_size),
        MASTER_ADDR=rnd.master_addr,
        MASTER_PORT=str(rnd.master_port),
        TORCHELASTIC_RESTART_COUNT=str(rnd.restart_count),
        TORCHELASTIC_MAX_RESTARTS=str(spec.max_restarts),
        TORCHELASTIC_RUN_ID=rnd.run_id,
        TORCHELASTIC_USE_AGENT_STORE=str(rnd.use_agent_store),
        TORCHELASTIC_ERROR_FILE=error_file,
        TORCHELASTIC_SIGNALS_TO_HANDLE=",".join(signal.Signals(s).name for s in spec.signals_to_handle),
        TORCH_NCCL_ASYNC_ERROR_HANDLING=base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        LAUNCHER_ROUND=str(rnd.round),
    )
    env[AGENT_ID_VAR] = agent_id
    if progress_file:
        env[PROGRESS_VAR] = progress_file
    if spec.hang_timeout:  # a hung worker's stacks are dumped on SIGABRT by faulthandler
        env.setdefault("PYTHONFAULTHANDLER", "1")
    env.update(_thread_defaults(base, worker.local_world_size))
    if rnd.ifname and rnd.group_world_size > 1 and "GLOO_SOCKET_IFNAME" not in base:
        # gloo otherwise binds the address its hostname resolves to, often loopback on clusters
        env["GLOO_SOCKET_IFNAME"] = rnd.ifname
    if spec.virtual_local_rank:
        visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = (
            visible[worker.local_rank] if worker.local_rank < len(visible) else str(worker.local_rank)
        )
    return env


def zygote_env(local_world_size: int, base: Mapping[str, str], *, agent_id: str) -> dict[str, str]:
    """The preloaded interpreter's environment: a worker's, less what differs between workers.

    What torch and its libraries read at import time (OMP_NUM_THREADS and the like) is set here as
    `worker_env` sets it, so that a forked worker ends with the same settings as a spawned one.
    """
    env = {k: v for k, v in base.items() if k not in AGENT_ONLY}
    env.update(_thread_defaults(base, local_world_size))
    env[AGENT_ID_VAR] = agent_id  # the guard's sweep finds the zygote and its forked workers by it
    return env


def _thread_defaults(base: Mapping[str, str], local_world_size: int) -> dict[str, str]:
    if "OMP_NUM_THREADS" not in base and local_world_size > 1:
        return {"OMP_NUM_THREADS": "1"}  # torchrun's rule: N workers would otherwise oversubscribe the cores
    return {}


def worker_argv(spec: WorkerSpec, worker: Worker) -> list[str]:
    """The command line of one worker; legacy scripts get `--local-rank=N` before their arguments."""
    argv = list(spec.program)
    if spec.local_rank_arg:
        argv.append(f"{spec.local_rank_arg}={worker.local_rank}")
    return argv + list(spec.script_args)


def workers_of(rnd: Round, nproc: int) -> list[Worker]:
    """This node's workers in a round: global rank = the node's offset + local rank."""
    return [
        Worker(local_rank=i, rank=rnd.rank_offset + i, local_world_size=nproc, world_size=rnd.world_size)
        for i in range(nproc)
    ]
