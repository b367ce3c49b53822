"""Defaults for `--nnodes`, `--node_rank`, `--master_addr` and `--master_port` inside a Slurm step.

Run one launcher per node (`srun --ntasks-per-node=1 python -m launcher ... train.py`) and the
topology comes from the step's SLURM_* variables, so job scripts need no glue:

  nnodes       SLURM_STEP_NUM_NODES (the step's), else SLURM_JOB_NUM_NODES / SLURM_NNODES
  node_rank    SLURM_NODEID: the node's index in the *step's* node list (a step on node[2-3]
               of a node[1-3] job gives node2 SLURM_NODEID=0)
  master_addr  the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST / SLURM_NODELIST),
               expanded with python-hostlist (`scontrol show hostnames` if it is missing).
               Inside srun SLURM_NODELIST is the *job's* list: its first host may not even be
               in the step, so step and job variables are never mixed.
  master_port  derived from SLURM_JOB_ID (multi-node steps only; one node picks a free port)

`cli.main()` passes `defaults(os.environ)` to click as its `default_map` when `in_step()`, so
the command line and PET_* variables still win. A value that cannot be resolved becomes a
default that raises `ConfigError` (one line, exit 2) when click asks for it: a broken Slurm
environment is loud, never a silent localhost, and a flag given by hand still overrides it.
Pure functions of the environment mapping; nothing heavy is imported.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Mapping

from .errors import ConfigError

# Ports derived from the job id: PORT_BASE + job_id % PORT_SPAN = 20000..28999. Below Linux's
# ephemeral range (32768-60999, where connect() picks source ports) and torch's 29400/29500
# defaults. Two jobs on one node collide only if their ids are equal modulo 9000 (Lightning's
# 15000 + the last four digits collides modulo 10000).
PORT_BASE, PORT_SPAN = 20000, 9000
HOST_RE = re.compile(r"[A-Za-z0-9_.-]+")  # a name or address, not a piece of list syntax
OPT_OUT = "LAUNCHER_SLURM"  # LAUNCHER_SLURM=0: ignore Slurm even inside a step


class Unresolved:
    """A click default that raises the reason it could not be derived, when click needs it."""

    def __init__(self, message: str):
        self.message = message

    def __call__(self) -> str:
        raise ConfigError(self.message)

    def __repr__(self) -> str:
        return f"Unresolved({self.message!r})"


def in_step(environ: Mapping[str, str]) -> bool:
    """True inside an srun step (SLURM_JOB_ID and SLURM_STEP_ID set), unless LAUNCHER_SLURM=0.

    The batch script and an salloc shell have no SLURM_STEP_ID: there SLURM_NODEID is 0 on
    whatever node the shell runs, so no defaults are derived from it.
    """
    if environ.get(OPT_OUT, "").strip().lower() in ("0", "no", "false", "off"):
        return False
    return bool(environ.get("SLURM_JOB_ID", "").strip()) and bool(environ.get("SLURM_STEP_ID", "").strip())


def master_port(job_id: str | int) -> int:
    """The rendezvous port of a job: every node computes the same one without talking."""
    text = str(job_id).strip()
    if not text.isascii() or not text.isdigit():  # int() would also take "1_2", "+3", " 4"
        raise ConfigError(f"Slurm: SLURM_JOB_ID={job_id!r} is not a number; pass --master_port")
    n = int(text)
    return PORT_BASE + n % PORT_SPAN


def expand_nodelist(text: str, scontrol: Callable[[str], list[str]] | None = None) -> list[str]:
    """`node[01-03,07],gpu-a[1-2]` → node01 node02 node03 node07 gpu-a1 gpu-a2, in Slurm's order.

    python-hostlist (an install requirement) parses the full syntax; `scontrol show hostnames` is
    the fallback only where that package is missing, because scontrol prints garbage for a bad
    list (`node[1-` gives `node]`, exit 0). `ConfigError` if no clean, non-empty list comes out.
    """
    text = str(text).strip()
    if not text:
        raise ConfigError("Slurm: the node list is empty")
    cannot = f"Slurm: cannot expand the node list {text!r}"
    try:
        import hostlist  # python-hostlist; imported only inside Slurm
    except ImportError:
        try:
            hosts = (scontrol or _scontrol_hostnames)(text)
        except ConfigError as e:
            raise ConfigError(f"{cannot}: python-hostlist is not installed and {e}") from None
        how = "scontrol show hostnames"
    else:
        try:
            hosts = hostlist.expand_hostlist(text, allow_duplicates=True)
        except hostlist.BadHostlist as e:
            raise ConfigError(f"{cannot}: {e}") from None
        how = "python-hostlist"
    bad = [h for h in hosts if not HOST_RE.fullmatch(h)]
    if not hosts or bad:
        raise ConfigError(f"{cannot}: {how} gave {' '.join(bad or hosts) or 'no hosts'}")
    return hosts


def _scontrol_hostnames(text: str) -> list[str]:
    exe = shutil.which("scontrol")
    if exe is None:
        raise ConfigError("scontrol is not on PATH")
    try:
        out = subprocess.run([exe, "show", "hostnames", text], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"scontrol failed: {e}") from None
    errors = out.stderr.strip().splitlines()
    if out.returncode != 0 or errors:
        raise ConfigError(f"scontrol failed: {errors[-1] if errors else f'exit {out.returncode}'}")
    return out.stdout.split()


def _count(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()):
        raise ConfigError(f"Slurm: {name}={text!r} is not a number; pass --nnodes")
    n = int(text)
    if n < 1:
        raise ConfigError(f"Slurm: {name}={text!r} must be at least 1; pass --nnodes")
    return n


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, int | None]:
    for name in names:
        n = _count(environ, name)
        if n is not None:
            return name, n
    return names[0], None


def defaults(environ: Mapping[str, str], scontrol: Callable[[str], list[str]] | None = None) -> dict[str, object]:
    """click `default_map` entries (strings, or `Unresolved` callables) for a Slurm step."""
    out: dict[str, object] = {}
    fix = "run one launcher per node with srun --ntasks-per-node=1, or pass"

    # -- nnodes: the step's count; the job's only when there are no step variables at all.
    step = any(environ.get(v, "").strip() for v in ("SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST"))
    nodes_var, nnodes = "SLURM_STEP_NUM_NODES" if step else "SLURM_JOB_NUM_NODES", None
    try:
        nodes_var, nnodes = (
            _first(environ, "SLURM_STEP_NUM_NODES") if step else _first(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
        )
        if nnodes is None:
            raise ConfigError(f"Slurm: {nodes_var} is not set; {fix} --nnodes")
        tasks_var, tasks = _first(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if step else ("", None)
        if tasks is not None and tasks != nnodes:
            raise ConfigError(
                f"Slurm: the step runs {tasks} tasks on {nnodes} nodes ({tasks_var}, {nodes_var}); "
                f"the launcher starts the workers itself: {fix} --nnodes/--node_rank"
            )
        out["nnodes"] = str(nnodes)
    except ConfigError as e:
        out["nnodes"] = Unresolved(str(e))
        nnodes = None

    # -- node_rank: SLURM_NODEID is relative to the step's node list.
    try:
        text = environ.get("SLURM_NODEID", "").strip()
        if not text:
            raise ConfigError(f"Slurm: SLURM_NODEID is not set; {fix} --node_rank")
        if not (text.isascii() and text.isdigit()):
            raise ConfigError(f"Slurm: SLURM_NODEID={text!r} is not a node index; pass --node_rank")
        if nnodes is not None and int(text) >= nnodes:
            raise ConfigError(f"Slurm: SLURM_NODEID={text} is out of range for {nodes_var}={nnodes}; pass --node_rank")
        out["node_rank"] = str(int(text))
    except ConfigError as e:
        out["node_rank"] = Unresolved(str(e))

    # -- master_addr: the first host of the same scope's node list.
    list_vars = ("SLURM_STEP_NODELIST",) if step else ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
    try:
        list_var = next((v for v in list_vars if environ.get(v, "").strip()), None)
        if list_var is None:
            raise ConfigError(f"Slurm: {list_vars[0]} is not set; pass --master_addr")
        try:
            hosts = expand_nodelist(environ[list_var], scontrol)
        except ConfigError as e:
            raise ConfigError(f"{e} ({list_var}); pass --master_addr") from None
        if nnodes is not None and len(hosts) != nnodes:
            raise ConfigError(
                f"Slurm: {list_var}={environ[list_var]!r} has {len(hosts)} hosts but {nodes_var}={nnodes}; "
                "pass --master_addr"
            )
        out["master_addr"] = hosts[0]
    except ConfigError as e:
        out["master_addr"] = Unresolved(str(e))

    # -- master_port: one node keeps the launcher's own free-port default (two steps of one job
    # on one node must not share a port); several nodes need a port they all know in advance.
    if nnodes is None or nnodes > 1:
        try:
            job_id = environ.get("SLURM_JOB_ID", "").strip()
            if not job_id:
                raise ConfigError("Slurm: SLURM_JOB_ID is not set; pass --master_port")
            out["master_port"] = str(master_port(job_id))
        except ConfigError as e:
            out["master_port"] = Unresolved(str(e))
    return out
