"""One episode: the cluster built (hosts, store, agents), its faults injected on schedule, and its record checked."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from . import exact, inplace
from .faults import World, inject, self_inflicted
from .invariants import check
from .net import SUBNET, Net
from .proc import IN_PLACE_STEPS, STEPS, Proc
from .records import (
    HANG_TIMEOUT,
    IN_PLACE_STEP_COUNT,
    IN_PLACE_TIMEOUT,
    LIVENESS,
    NODES,
    READ_TIMEOUT,
    AgentRecord,
    Episode,
    Event,
    Fault,
    Shape,
    StepLine,
)
from .reference import Reference
from .stores import C10dStore, EtcdCluster

ORPHAN_WAIT = 10.0  # s an ended agent's processes get to be gone before they count as left behind
IN_PLACE_RESTARTS = 3  # the in-place shape's --max_restarts: 1-2 faults never spend it


def shape_size(ep: Episode) -> tuple[str, int]:
    """The shape's --nnodes and --nproc_per_node."""
    if ep.shape is Shape.IN_PLACE:
        return ("2", 2) if ep.spare else ("1", 3)
    return ("2" if ep.shape is Shape.SPARES else "2:3"), 2


def agent_argv(ep: Episode, endpoint: str, logs: Path) -> list[str]:
    """Every agent's command line: the shape's job on the episode's store, tests/workers/steps.py its workers."""
    # join_timeout and replace_timeout inside the bound: nodes left below MIN wait for replacements that
    # long (a re-forming elastic job; a fixed-size one that lost a member with no spare left), then say so
    conf = (
        f"last_call_timeout=1,read_timeout={READ_TIMEOUT:g},join_timeout=20,replace_timeout=20,"
        f"keep_alive_max_attempt={LIVENESS / 0.5:.0f}" + (",is_host=false" if ep.backend == "c10d" else "")
    )
    spares = ep.shape is Shape.SPARES
    in_place = ep.shape is Shape.IN_PLACE
    nnodes, nproc = shape_size(ep)
    argv = [
        sys.executable,
        "-m",
        "launcher",
        "--nnodes",
        nnodes,
        "--nproc_per_node",
        str(nproc),
        "--max_restarts",
        str(IN_PLACE_RESTARTS if in_place else 3),
        "--rdzv_backend",
        ep.backend,
        "--rdzv_endpoint",
        endpoint,
        "--rdzv_id",
        f"chaos{ep.shape.value}{ep.seed}",
        "--rdzv_conf",
        conf,
        "--log_dir",
        str(logs),
    ]
    if spares:  # quarantine at the first failure
        argv += ["--quarantine", "after=1,window=2"]
    if in_place:  # each agent's events file is --log_dir/events-$SLURMD_NODENAME.jsonl (see agent_env)
        argv += ["--recovery", "in-place", "--preload", "--hang_timeout", f"{HANG_TIMEOUT:g}"]
        argv += ["--in_place_timeout", f"{IN_PLACE_TIMEOUT:g}"]
        return [*argv, str(IN_PLACE_STEPS)]
    return [*argv, str(STEPS)]


def agent_env(ep: Episode, ckpt: Path, i: int) -> dict[str, str]:
    """Node i's environment for its workers: the checkpoint folder, the training's length, its node name."""
    # 4 s of training; 12 s with a link cut (a cut node may give up while its workers run), 20 s with a
    # link down for good (a node that never gives up runs its workers past STOP_S)
    if ep.shape is Shape.IN_PLACE:  # the step logs live beside the checkpoint folder
        steps = {"STEP_LOG": str(ckpt), "STEPS": str(IN_PLACE_STEP_COUNT), "STEP_TIME": "0.05"}
        steps |= {"SEED": str(ep.train_seed), "DIE_AT": ",".join(d.entry() for d in ep.dies)}
        if ep.join_delay:
            steps["JOIN_DELAY"] = f"{ep.join_delay:g}"
        return {**steps, "SLURMD_NODENAME": f"node{i}", "PET_EVENTS_FILE": str(ckpt.parent / f"events-node{i}.jsonl")}
    kinds = {f for _, f in ep.faults}
    steps = 400 if Fault.LINK_DOWN in kinds else 240 if Fault.LINK_CUT in kinds else 80
    env = {"CKPT_DIR": str(ckpt), "STEPS": str(steps), "STEP_TIME": "0.05"}
    if ep.shape is Shape.SPARES:  # each agent its own node name (they share a host name)
        env["SLURMD_NODENAME"] = f"node{i}"
    return env


def left_after(a: Proc) -> list[int]:
    """The pids of an ended agent still alive after ORPHAN_WAIT s (none, when all went sooner)."""
    deadline = time.monotonic() + ORPHAN_WAIT
    while a.left() and time.monotonic() < deadline:
        time.sleep(0.05)
    return a.left()


def read_checkpoint(ckpt: Path) -> str | None:
    """The checkpoint file's text, None when none was written."""
    try:
        return (ckpt / "ckpt.json").read_text()
    except FileNotFoundError:
        return None


def read_events(r: AgentRecord, path: Path) -> AgentRecord:
    """`r` with its events file's events (none where it wrote none)."""
    lines = path.read_text().splitlines() if path.exists() else []
    return replace(r, events=tuple(e for e in map(Event.parse, lines) if e is not None))


def read_steps(folder: Path) -> list[StepLine]:
    """Every line of the in-place workers' step logs."""
    lines = (StepLine.parse(x) for f in sorted(folder.iterdir()) for x in f.read_text().splitlines())
    return [x for x in lines if x is not None]


def run_episode(
    ep: Episode,
    bound: float,
    keep: bool = False,
    verbose: bool = False,
    netns: bool = False,
    ref: Reference | None = None,
) -> Episode:
    """Run `ep`'s job with its faults, check its invariants into ep.violations (in place, its final weights
    against `ref`'s); everything it started is gone when it returns, its folder too unless `keep`."""
    rng = random.Random(ep.seed * 7919 + 1)  # victims, lengths and pauses
    began = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix=f"chaos-{ep.backend}-{ep.seed}-"))
    ckpt, logs = folder / "ckpt", folder / "logs"
    ckpt.mkdir()
    logs.mkdir()
    mounted = False
    net = store = world = None
    agents: list[Proc] = []
    try:
        if any(f is Fault.DISK_FULL for _, f in ep.faults):
            mount = ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(logs)]
            mounted = subprocess.run(mount, capture_output=True).returncode == 0
        net = Net(f"chaos{os.getpid()}-{ep.seed}") if netns else None
        addr, hub = (f"{SUBNET}.1", net.hub) if net else ("127.0.0.1", None)
        store = C10dStore(addr, hub) if ep.backend == "c10d" else EtcdCluster(folder, addr, hub)
        argv = agent_argv(ep, store.endpoint, logs)
        spares = ep.shape is Shape.SPARES or ep.spare
        nnodes, nproc = shape_size(ep)
        members = 2 if spares else int(nnodes) if ep.shape is Shape.IN_PLACE else NODES  # a spare: once they run

        def agent(i: int) -> Proc:
            return Proc(f"node{i}", argv, agent_env(ep, ckpt, i), net.nodes[i] if net else None)

        agents = [agent(i) for i in range(members)]
        world = World(agents, store, net, logs if mounted else None, ckpt if ep.shape is Shape.IN_PLACE else None)
        t_start = time.monotonic()
        # in place, each agent's zygote imports torch before the first worker: on busy cores, 10-30 s
        start_bound = bound if ep.shape is Shape.IN_PLACE else bound / 2
        # a worker lost at startup or teardown may have the others wait --in_place_timeout (what exact.py checks)
        slack = IN_PLACE_TIMEOUT if {d.phase for d in ep.dies} & {Fault.STARTUP.value, Fault.TEARDOWN.value} else 0.0
        start_bound += slack
        while sum(a.started() for a in agents) < nproc * members:
            if time.monotonic() - t_start > start_bound:
                said = [a.err[-1] for a in agents if a.err]  # e.g. a flag this launcher refuses
                ep.violations.append(f"the job never started: not every worker of the first round ran: {said}")
                return ep
            time.sleep(0.02)
        if spares:
            agents.append(agent(members))
            while not any("waiting as a spare" in line for line in agents[-1].err):
                if time.monotonic() - t_start > start_bound or agents[-1].popen.poll() is not None:
                    ep.violations.append(f"the third node never said it waits as a spare: {agents[-1].err[-3:]}")
                    return ep
                time.sleep(0.02)
        t0 = time.monotonic()
        for at, fault in ep.faults:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            inject(ep, fault, world, rng)
        deadline = t0 + bound + slack
        rcs = {a.name: (a.finish(deadline - time.monotonic()) if not a.killed else -9) for a in agents}
        records = [a.record(rcs[a.name], left_after(a) if rcs[a.name] is not None else []) for a in agents]
        if ep.shape is Shape.IN_PLACE:
            records = [read_events(r, folder / f"events-{r.name}.jsonl") for r in records]
            lines = read_steps(ckpt)
            self_inflicted(ep, lines)  # the workers' DIE_AT deaths that landed
            ep.violations += check(ep, records, None)
            world_size, cap = nproc * members, IN_PLACE_RESTARTS
            stepped = [x for x in lines if x.kind in ("start", "step")]
            ep.violations += inplace.check(ep, records, stepped, world_size, IN_PLACE_STEP_COUNT, cap)
            if ref is not None:
                ep.violations += exact.check(ep, records, lines, ref)
        else:
            ep.violations += check(ep, records, read_checkpoint(ckpt))
        if ep.violations and verbose:
            show(records)
    except Exception as e:  # the harness itself: reported as a violation, never swallowed
        ep.violations.append(f"harness error: {type(e).__name__}: {e}")
    finally:
        for t in world.timers if world else []:
            t.cancel()
        for a in agents:
            a.kill_all()
        if store is not None:
            store.close()
        if net is not None:
            net.close()
        if mounted:
            subprocess.run(["umount", "-l", str(logs)], capture_output=True)
        if keep:  # the agents' output beside their logs and checkpoint
            for a in agents:
                (folder / f"{a.name}.out").write_text("\n".join(a.out))
                (folder / f"{a.name}.err").write_text("\n".join(a.err))
            ep.kept = folder
        else:
            shutil.rmtree(folder, ignore_errors=True)
        ep.seconds = time.monotonic() - began
    return ep


def show(records: list[AgentRecord]) -> None:
    """--verbose: the last lines of each agent's stderr."""
    for a in records:
        print(f"----- {a.name} rc={a.rc}\n" + "\n".join(a.err[-30:]), flush=True)
