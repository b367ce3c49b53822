"""A training job to check that in place changes nothing it computes (tests/e2e/test_in_place_exact.py).

DDP over a model with Dropout and BatchNorm (its random streams and buffers matter), trained for EPOCHS
epochs of a DataLoader with a DistributedSampler, each rank seeding its own streams per epoch (as
examples/train_ddp.py does); inside each step, after the optimizer's step, a logged loss all_reduce.
Each process appends to $STEP_LOG/<rank>.<pid>: "applied <step> <sample ids>" right after each
optimizer step it applied, and at the end "final <steps> <sha256 of the weights>".
DIE_AT="RANK STEP PHASE" (first round only): that rank SIGKILLs itself in that step at PHASE:
`before` (after the forward), `after` (after the optimizer step, before the loss all_reduce), or
STEP `end` (after the last step, before job.close()); DIE_TOO="RANK DELAY": another rank dies DELAY s
after the first (both at DIE_AT's step). DIE_AT="RANK 0 start" dies at start-up, before `Job()`;
DIE_AT="RANK EPOCH eval" at the end of that epoch, before an all_reduce outside `with step:` (an eval's);
DIE_AT="RANK STEP hang": that rank blocks, silent, after the forward (its peers then wait on it).
DIE_AT may list several entries, "R S P, R S P": one fault each, each of another rank's first process
(several recoveries in one job); DIE_TOO and DIE_REDO go by the first.
HOLD_AT=STEP: every rank prints "holding rank=R" at that step's start, and waits there until it is stopped.
DIE_REDO=RANK: that rank (a first-round process) dies again at DIE_AT's step when it runs it again after
the recovery (after the forward): the replacement then runs that step a second time.
JOIN_DELAY=S: a process started after the first round waits S s before `Job()`.
FLAT=1: `job.steps(n)` over EPOCHS * 12 steps, each batch a function of the step (the API before loaders).
WIDTH=N: the model's hidden layer N wide (16: the default), a state big enough to see in the copies' sizes.
FROZEN=1: a frozen module is kept too (no parameter of it trained: the same weights).
RESUMES=1: each process prints what `job.resumes()` says (whether the group resumes from the copies in memory).
STATEFUL=1: the loader is torchdata's StatefulDataLoader (the job resumes it from its state_dict), over the
same sampler: the same batches, so the same weights as the DataLoader's run.
"""

import hashlib
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from die_at import dies_of
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

e = os.environ
first_round = e.get("LAUNCHER_ROUND", "0") == "0" and e["TORCHELASTIC_RESTART_COUNT"] == "0"
die = dies_of(e.get("DIE_AT", ""), ("start", "before", "hang", "after", "eval", "end"))
dies = {(d.rank, d.step, d.phase) for d in die}
die_step, die_phase = (die[0].step, die[0].phase) if die else (-1, "")
too = e.get("DIE_TOO", "").split()
rank_now = int(e["RANK"])


def dies_at(step: int, phase: str) -> bool:
    """Whether this process is to die at `step`'s `phase` (a first-round process, named by DIE_AT)."""
    return first_round and (rank_now, step, phase) in dies


def kill(after: float = 0.0) -> None:
    if after:
        time.sleep(after)
    os.kill(os.getpid(), signal.SIGKILL)


if dies_at(0, "start"):
    kill()
if first_round and too and int(too[0]) == rank_now and die_phase == "start":
    kill(float(too[1]))

if not first_round:  # JOIN_DELAY: a replacement slow to start (a big import, a busy host)
    time.sleep(float(e.get("JOIN_DELAY", "0")))

import logging  # noqa: E402

from launcher.worker.inplace import Job  # noqa: E402

logging.basicConfig(format="%(message)s")
logging.getLogger("launcher.worker.inplace").setLevel(logging.INFO)  # a line per recovery

job = Job(notice=5.0)
rank, world, pid = job.rank, job.world_size, os.getpid()
log = open(os.path.join(e["STEP_LOG"], f"{rank}.{pid}"), "a", buffering=1)

g = torch.Generator().manual_seed(7)
n = 96 * world
data = TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g), torch.arange(n))
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
if e.get("STATEFUL"):
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(data, batch_size=8, sampler=sampler)
else:
    loader = DataLoader(data, batch_size=8, sampler=sampler)

torch.manual_seed(0)
width = int(e.get("WIDTH", "16"))
model = nn.Sequential(nn.Linear(8, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Dropout(0.3), nn.Linear(width, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
frozen = {"frozen": nn.Linear(4, 4).requires_grad_(False)} if e.get("FROZEN") else {}  # a fine-tune's frozen part
job.keep(model=model, optimizer=optimizer, **frozen)
if e.get("RESUMES"):  # where a script would skip loading its own checkpoint
    print(f"rank {rank}: resumes from memory: {job.resumes()}", flush=True)
job.ddp(model)
epochs, step_time = int(e.get("EPOCHS", "2")), float(e.get("STEP_TIME", "0"))


def flat():
    """One pass of FLAT steps: a step's batch is a function of the step."""
    torch.manual_seed(rank)
    for step in job.steps(epochs * len(loader)):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(step.index))
        step.batch = data[order[rank * 8 : (rank + 1) * 8]]
        yield step


def passes():
    for epoch in job.epochs(range(epochs)):
        sampler.set_epoch(epoch)
        torch.manual_seed(1000 * epoch + rank)  # each rank's own dropout masks, per epoch
        yield from job.steps(loader)
        if dies_at(epoch, "eval"):
            kill()
        dist.all_reduce(torch.ones(1))  # an eval's collective, outside `with step:`


for step in flat() if e.get("FLAT") else passes():
    if e.get("HOLD_AT") == str(step.index):
        print(f"holding rank={rank}", flush=True)
        time.sleep(3600)
    with step:
        x, y, ids = step.batch
        out = job.model(x)
        if dies_at(step.index, "before"):
            kill()
        if dies_at(step.index, "hang"):
            time.sleep(3600)
        redo = e.get("DIE_REDO") == str(rank) and first_round and step.index == die_step and job.round > 0
        if redo:
            kill()
        loss = nn.functional.cross_entropy(out, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        log.write(f"applied {step.index} {' '.join(map(str, ids.tolist()))}\n")
        if too and first_round and int(too[0]) == rank and step.index == die_step:
            threading.Thread(target=kill, args=(float(too[1]),), daemon=True).start()
        if dies_at(step.index, "after"):
            kill()
        dist.all_reduce(loss.detach())  # the logged loss: a collective after the commit point
        time.sleep(step_time)

if first_round and any(r == rank_now and p == "end" for r, _, p in dies):
    kill()


def digest(tensors) -> str:
    return hashlib.sha256(b"".join(t.detach().contiguous().numpy().tobytes() for t in tensors)).hexdigest()


weights, buffers = digest(model.parameters()), digest(model.buffers())  # buffers: this rank's own statistics
log.write(f"final {job.step} {weights} {buffers}\n")
print(f"rank {rank}: final {job.step} weights {weights[:16]} buffers {buffers[:16]}", flush=True)
job.close()
