"""An in-place training loop for the chaos campaign's `in-place` shape (scripts/chaos/inplace.py).

A tiny DDP model on gloo under `launcher.worker.inplace.Job`: STEPS steps of STEP_TIME s each. Each
process appends to $STEP_LOG/<rank>.<pid> one line per event, flushed at once:
"start <pid> <rank> <world> <round> <step> <t>" once it holds the state, then
"step <pid> <rank> <world> <round> <step> <t>" after each step done (`step`: the steps done; `t`:
time.time(), the clock of the agents' events files). Stdout has the campaign's "start rank= world=
restart= round= from=" line and a "done" line. HANG_AT="RANK[,RANK...] STEP": those ranks block, silent,
in that step of the job's first round (their peers then wait on them in the step's all-reduce). DEAF=1:
the ranks HANG_AT blocks ignore SIGTERM and SIGABRT there (stuck in native code that acts on neither:
no stacks, and their stop takes the whole --shutdown_timeout). JOIN_DELAY=S: a replacement sleeps S s
before it joins (the survivors wait for it, silent).
"""

import os
import signal
import time

import torch
import torch.nn as nn

import launcher
from launcher.worker.inplace import Job

e = os.environ
steps, step_time = int(e.get("STEPS", "40")), float(e.get("STEP_TIME", "0.05"))
hang = e.get("HANG_AT", "").split()
hang_ranks, hang_step = ({int(r) for r in hang[0].split(",")}, int(hang[1])) if hang else (set(), -1)
job = Job(notice=5.0)
if job.joining:  # JOIN_DELAY: a replacement slow to reach the state (a big model, a busy host)
    time.sleep(float(e.get("JOIN_DELAY", "0")))
rank, world, pid = job.rank, job.world_size, os.getpid()
log = open(os.path.join(e["STEP_LOG"], f"{rank}.{pid}"), "a", buffering=1)


def note(kind: str) -> None:
    log.write(f"{kind} {pid} {rank} {job.world_size} {job.round} {job.step} {time.time():.6f}\n")


torch.manual_seed(0)
model = nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
job.keep(model=model, optimizer=optimizer)
job.ddp(model)
started = False
for step in job.steps(steps):
    if not started:  # the state is in place (a newcomer received it): where this process begins
        started = True
        note("start")
        restart = e["TORCHELASTIC_RESTART_COUNT"]
        print(f"start rank={rank} world={world} restart={restart} round={job.round} from={job.step}", flush=True)
    with step:
        if rank in hang_ranks and step.index == hang_step and e["TORCHELASTIC_RESTART_COUNT"] == "0":  # HANG_AT
            for sig in (signal.SIGTERM, signal.SIGABRT) if e.get("DEAF") else ():
                signal.signal(sig, signal.SIG_IGN)
            time.sleep(3600)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step.index * 100 + rank))
        optimizer.zero_grad()
        job.model(x).sum().backward()
        optimizer.step()
        time.sleep(step_time)
    if step.done:  # else a lost peer broke it: the job recovered, and the loop gives the same step again
        note("step")
    launcher.progress(step=job.step)
print(f"done rank={rank} world={world} steps={job.step}", flush=True)
job.close()
