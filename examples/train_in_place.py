"""Train examples/train_ddp.py's classifier with DDP, recovering in place from a lost worker.

    python -m launcher --nproc_per_node 4 --recovery in-place --max_restarts 2 \\
        examples/train_in_place.py --steps 150

Kill one worker mid-run (`kill -9 PID`, or `--crash-at-step 60 --crash-rank 2` here): the launcher
starts a replacement for that rank alone; the others finish the step in flight with an error,
join the new round, and one of them sends the replacement the model, the optimizer's momentum,
the step and the RNG over the new process group. Training goes on from the step in flight, with
no checkpoint read. What a script needs for that is the four lines marked "in place" below
(docs/in-place.md). Without --recovery in-place the same script runs, and a lost worker ends it
(or restarts the group from step 0: it writes no checkpoint).
"""

import argparse
import logging
import os
import signal
import time

import torch
import torch.nn as nn

import launcher
from launcher.worker.inplace import Job

p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
p.add_argument("--steps", type=int, default=150, help="training steps in all")
p.add_argument("--batch-size", type=int, default=64, help="per worker")
p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
p.add_argument("--seed", type=int, default=0, help="model init and data order")
p.add_argument("--step-time", type=float, default=0.0, metavar="SEC", help="sleep this long in each step")
p.add_argument("--crash-at-step", type=int, metavar="S", help="test hook: --crash-rank SIGKILLs itself in step S")
p.add_argument("--crash-rank", type=int, default=1, metavar="R", help="the rank --crash-at-step kills")
p.add_argument("--out", help="rank 0 saves the final model state_dict here")
args = p.parse_args()
if "RANK" not in os.environ:
    p.exit(2, "run me under the launcher: python -m launcher --nproc_per_node 2 examples/train_in_place.py\n")

logging.basicConfig(format="%(message)s")
logging.getLogger("launcher.worker.inplace").setLevel(logging.INFO)  # one line per recovery
job = Job()  # in place: joins this round's process group (gloo on CPU, nccl on GPUs)
rank, world = job.rank, job.world_size
if job.joining:  # a replacement: a survivor sends the state below (big state: torch.empty here, not zeros)
    print(f"rank {rank}: a replacement in round {job.round}; the state comes from a survivor", flush=True)
first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
if job.backend == "nccl":
    torch.cuda.set_device(job.device)

# The same 4096 samples as examples/train_ddp.py, on every rank, from a fixed seed.
g = torch.Generator().manual_seed(1234)
centers = torch.randn(4, 32, generator=g) * 0.5
labels = torch.randint(0, 4, (4096,), generator=g)
inputs = centers[labels] + torch.randn(4096, 32, generator=g)

torch.manual_seed(args.seed)
model = nn.Sequential(
    nn.Linear(32, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4)
).to(job.device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()

job.keep(model=model, optimizer=optimizer)  # in place: what a replacement receives from a survivor
job.ddp(model)  # in place: job.model is DDP(model), made again after each recovery


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of `step`: a function of the step alone, so a redone step sees the same data."""
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(args.seed * 100_003 + step))
    mine = order[rank * args.batch_size : (rank + 1) * args.batch_size]
    return inputs[mine].to(job.device), labels[mine].to(job.device)


began = time.monotonic()
for step in job.steps(args.steps):  # in place: a step a lost peer broke comes again
    with step:
        x, y = batch(step.index)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(job.model(x), y)
        if first_attempt and step.index == args.crash_at_step and rank == args.crash_rank:
            print(f"rank {rank}: test hook, killing myself in step {step.index}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()  # DDP's allreduce: where a lost peer shows
        optimizer.step()
        time.sleep(args.step_time)
    launcher.progress(step=job.step)
    if rank == 0 and (job.step % 50 == 0 or job.step == args.steps):
        print(f"step {job.step}/{args.steps}  loss {loss.item():.4f}", flush=True)

checksum = sum(float(t.double().sum()) for t in model.state_dict().values())
print(f"rank {rank}: weights checksum {checksum:.6f}", flush=True)  # the same on every rank, replacements too
for r in job.recoveries:
    what = f"sent {r.sent / 1e6:.2f} MB of state" if r.sent else "received the state" if r.received else "kept"
    print(f"rank {rank}: recovered in place in round {r.round} in {r.seconds:.3f} s; {what}", flush=True)
if rank == 0:
    print(f"done: {job.step} steps in {time.monotonic() - began:.1f} s", flush=True)
    if args.out:
        torch.save(model.state_dict(), args.out)
job.close()
