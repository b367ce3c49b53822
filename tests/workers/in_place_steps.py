"""An in-place training loop for the chaos campaign's `in-place` shape (scripts/chaos/inplace.py), exactly
reproducible: its final weights are a function of the world size, STEPS and SEED alone.

A small DDP model on gloo under `launcher.worker.inplace.Job` (Linear, BatchNorm, Dropout, Linear: the
RNG and the buffers matter), Adam, STEPS steps. A step's data is a function of SEED, the step and the
rank; each rank's dropout draws from its own stream (seeded from SEED and the rank). In each step: a sleep
of STEP_TIME s, the forward, the backward, optimizer.step() (the commit point), then an all-reduce of the
loss (a collective after the commit: a peer lost there used to make the step, and its update, run twice).

Each process appends to $STEP_LOG/<rank>.<pid> one line per event, flushed at once, each
"<kind> <pid> <rank> <world> <round> <step> <t> [...]" (`step`: the steps done; `t`: time.time()):
- "start": once it holds the state; "step ... <loss>": after each step done (the all-reduced mean loss);
- "applied": an optimizer step ran in this process (`step`: that step's index);
- "die ... <phase>": right before it SIGKILLs itself (DIE_AT);
- "final ... <applied> <lineage> <sha256>" after the last step: the optimizer steps this process applied,
  those its state holds (Adam's own count, passed on with the state: the whole lineage's), and a hash of
  the model's final state_dict (weights and buffers).
Stdout has the campaign's "start rank= world= restart= round= from=" line and a "done" line.

Faults it inflicts on itself, in the job's first round only (a process started in round 0):
- DIE_AT="RANK STEP PHASE [DELAY],...": that rank SIGKILLs itself, DELAY s (default 0) after reaching
  PHASE of step STEP: `startup` (before Job(); STEP ignored), `before-commit` (in the forward, after the
  dropout drew), `after-commit` (after optimizer.step(), before the loss all-reduce), `teardown` (after
  the last step and its "final" line, before job.close(); STEP ignored). Two entries at one point, one
  with a DELAY of 0.04-0.07, kill two ranks that far apart.
- HANG_AT="RANK[,RANK...] STEP": those ranks block, silent, in that step (their peers then wait on them);
  DEAF=1: they ignore SIGTERM and SIGABRT there (stuck in native code that acts on neither: no stacks,
  and their stop takes the whole --shutdown_timeout).
JOIN_DELAY=S: a replacement sleeps S s before it joins (the survivors wait for it, silent).
"""

import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from die_at import dies_of

import launcher
from launcher.worker.inplace import Job

PHASES = ("startup", "before-commit", "after-commit", "teardown")


e = os.environ
steps, step_time, seed = int(e.get("STEPS", "40")), float(e.get("STEP_TIME", "0.05")), int(e.get("SEED", "0"))
rank, world, pid = int(e["RANK"]), int(e["WORLD_SIZE"]), os.getpid()
first_round = all(e.get(k, "0") == "0" for k in ("LAUNCHER_ROUND", "TORCHELASTIC_RESTART_COUNT"))
mine = [d for d in dies_of(e.get("DIE_AT", ""), PHASES) if d.rank == rank] if first_round else []
hang = e.get("HANG_AT", "").split()
hang_ranks, hang_step = ({int(r) for r in hang[0].split(",")}, int(hang[1])) if hang and first_round else (set(), -1)
log = open(os.path.join(e["STEP_LOG"], f"{rank}.{pid}"), "a", buffering=1)
job: Job | None = None


def note(kind: str, *extra: object) -> None:
    """One line of this process's step log."""
    rnd, done = (job.round, job.step) if job is not None else (int(e.get("LAUNCHER_ROUND", "0")), 0)
    tail = "".join(f" {x}" for x in extra)
    log.write(f"{kind} {pid} {rank} {world} {rnd} {done} {time.time():.6f}{tail}\n")


def die(phase: str, index: int = -1) -> None:
    """DIE_AT: SIGKILL this process if it is to die here (its "die" line first)."""
    for d in mine:
        if d.phase == phase and (phase in ("startup", "teardown") or d.step == index):
            time.sleep(d.delay)
            note("die", phase)
            os.kill(pid, signal.SIGKILL)


die("startup")
job = Job(notice=5.0)
if job.joining:  # JOIN_DELAY: a replacement slow to reach the state (a big model, a busy host)
    time.sleep(float(e.get("JOIN_DELAY", "0")))

torch.manual_seed(seed)  # the same initial model on every rank
model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
torch.manual_seed(seed * 1000 + 1 + rank)  # this rank's own dropout stream
index = -1  # the step in flight
applied = 0  # optimizer steps applied in this process


def on_applied(*_: object) -> None:
    """The optimizer's step post hook: one more step applied here."""
    global applied
    applied += 1
    note("applied")


optimizer.register_step_post_hook(on_applied)
model[4].register_forward_pre_hook(lambda *_: die("before-commit", index))  # after the dropout drew
job.keep(model=model, optimizer=optimizer)
job.ddp(model)
started = False
for step in job.steps(steps):
    if not started:  # the state is in place (a newcomer received it): where this process begins
        started = True
        note("start")
        # round=: the round it was started in, whose restart count it has (it may begin in a later one:
        # started while its round was being replaced, it joined the newest)
        restart, spawned = e["TORCHELASTIC_RESTART_COUNT"], e.get("LAUNCHER_ROUND", "0")
        print(f"start rank={rank} world={world} restart={restart} round={spawned} from={job.step}", flush=True)
    with step:
        index = step.index
        if rank in hang_ranks and step.index == hang_step:  # HANG_AT: blocks, silent, once
            for sig in (signal.SIGTERM, signal.SIGABRT) if e.get("DEAF") else ():
                signal.signal(sig, signal.SIG_IGN)
            time.sleep(3600)
        time.sleep(step_time)
        data = torch.Generator().manual_seed(seed * 1_000_003 + step.index * 101 + rank)
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 4, generator=data)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(job.model(x), y)
        loss.backward()
        optimizer.step()  # the commit point
        die("after-commit", step.index)
        total = loss.detach().clone()
        dist.all_reduce(total)  # the logged loss: a collective after the commit
    if step.done:  # else a lost peer broke it: the job recovered, and the loop gives the same step again
        note("step", f"{total.item() / world:.6f}")
    launcher.progress(step=job.step)
weights = hashlib.sha256(b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in model.state_dict().values()))
lineage = int(max((float(s["step"]) for s in optimizer.state.values()), default=0.0))  # Adam's count, kept
note("final", applied, lineage, weights.hexdigest())
die("teardown")
print(f"done rank={rank} world={world} steps={job.step}", flush=True)
job.close()
