"""Train a small classifier with DistributedDataParallel: the launcher's demo job.

    python -m launcher --nproc_per_node 2 examples/train_ddp.py [--epochs 5] [--out final.pt]

What it shows, in the order you meet it below:
  * init from the environment the launcher sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT...);
    gloo on CPU, nccl and one GPU per worker (LOCAL_RANK) when CUDA is there;
  * a synthetic dataset built from a fixed seed (no download), split across ranks with
    DistributedSampler, reshuffled each epoch by sampler.set_epoch(epoch);
  * mixed precision (autocast + GradScaler) on CUDA only;
  * rank 0 writes a checkpoint at the end of every --checkpoint-every epochs, atomically
    (temp file + os.replace), then all ranks meet at a barrier;
  * at start every rank resumes from that checkpoint if there is one. With --max_restarts the
    launcher restarts the whole group when a worker dies; the new group picks up at the last
    step, from the launcher's copy in memory of what `job.keep` holds (docs/memory.md), or at the
    last checkpoint where there is none, and, because everything random is seeded per epoch, ends
    with exactly the same weights as a run that never failed. Try it:
        rm -rf /tmp/ckpt; python -m launcher --nproc_per_node 2 --max_restarts 1 examples/train_ddp.py \
            --checkpoint-dir /tmp/ckpt --crash-at-epoch 2 --crash-rank 1
  * with --recovery in-place (the lines that use `job`, docs/in-place.md) only the lost worker starts
    again: a survivor sends it the state, it resumes at the batch in flight, and nobody reads a
    checkpoint; the weights are again those of a run that never failed, bit for bit.
Checkpoints go to ./runs/ckpt by default; a second run with the same directory resumes (or
has nothing left to do), so delete it or pass another --checkpoint-dir to start over. On
several nodes the directory must be on storage that every node sees.
"""

import signal

# A Slurm pre-emption warning (sbatch --signal=USR1@90 and launcher --passthrough_signals SIGUSR1)
# asks for a checkpoint soon. Catch it first thing, before the slow imports: note it, write a
# checkpoint at the end of the current epoch, and carry on.
WARNED = []
signal.signal(signal.SIGUSR1, lambda *_: WARNED.append(1))

import argparse  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

from launcher.worker.inplace import Job  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
p.add_argument("--epochs", type=int, default=5, help="epochs in all, counting resumed ones")
p.add_argument("--batch-size", type=int, default=64, help="per worker")
p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
p.add_argument("--seed", type=int, default=0, help="model init, data order and dropout")
p.add_argument("--checkpoint-dir", default=os.path.join("runs", "ckpt"), help="resume from here")
p.add_argument(
    "--checkpoint-every", type=int, default=1, metavar="N", help="checkpoint every N epochs and after the last one"
)
p.add_argument("--out", help="rank 0 saves the final model state_dict here")
p.add_argument(
    "--crash-at-epoch",
    type=int,
    metavar="E",
    help="test hook: --crash-rank SIGKILLs itself halfway through epoch E (first attempt only)",
)
p.add_argument("--crash-rank", type=int, default=1, metavar="R", help="the rank --crash-at-epoch kills")
p.add_argument(
    "--step-time", type=float, default=0.0, metavar="SEC", help="sleep this long in each step (a bigger model's step)"
)
args = p.parse_args()
if "RANK" not in os.environ:
    p.exit(2, "run me under the launcher: python -m launcher --nproc_per_node 2 examples/train_ddp.py\n")

# --- 1. Join the group. The launcher set everything init_process_group reads (env://). -------
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # 0 first, then 1, 2... on restarts
use_cuda = torch.cuda.is_available()
if use_cuda:
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
else:
    device = torch.device("cpu")
job = Job()  # init_process_group from the environment; with --recovery in-place, a lost rank comes back alone


def log(msg):
    if rank == 0:
        print(msg, flush=True)


log(
    f"attempt {attempt} (TORCHELASTIC_RESTART_COUNT={attempt}): {world} workers, "
    f"backend {dist.get_backend()}, device {device.type}"
)

# --- 2. Data: the same 4096 samples on every rank, from a fixed seed. Four classes of points,
# each a Gaussian blob in 32 dimensions, so the loss visibly goes down.
g = torch.Generator().manual_seed(1234)
centers = torch.randn(4, 32, generator=g) * 0.5  # close blobs: not too easy
labels = torch.randint(0, 4, (4096,), generator=g)
inputs = centers[labels] + torch.randn(4096, 32, generator=g)
dataset = TensorDataset(inputs, labels)
# Each rank sees its own 1/world of the data; the order depends only on (seed, epoch).
sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

# --- 3. Model, optimizer, mixed-precision scaler (a no-op unless CUDA). -----------------------
torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
model = nn.Sequential(
    nn.Linear(32, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4)
).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
scaler = torch.amp.GradScaler("cuda", enabled=use_cuda)

# --- 4. Resume. Everything a later epoch depends on is in the checkpoint: weights, optimizer
# momentum, scaler, and the epoch count (the data order and dropout follow from the epoch).
ckpt_dir = os.path.abspath(args.checkpoint_dir)
ckpt_path = os.path.join(ckpt_dir, "last.pt")
os.makedirs(ckpt_dir, exist_ok=True)
start_epoch, loaded = 1, ""
if os.path.exists(ckpt_path):
    state = torch.load(ckpt_path, map_location=device)  # tensors straight onto our device
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    start_epoch, loaded = state["epoch"] + 1, f"{ckpt_path} after epoch {state['epoch']}"
    log(f"loaded {loaded}")
else:
    log(f"no checkpoint yet; training from scratch, checkpoints go to {ckpt_path}")
if start_epoch > args.epochs:
    log(
        f"nothing to do: the checkpoint already covers {args.epochs} epochs "
        f"(delete {ckpt_dir} or pass another --checkpoint-dir to train again)"
    )

job.keep(model=model, optimizer=optimizer, scaler=scaler)  # what a replacement receives from a survivor
job.ddp(model, device_ids=[local_rank] if use_cuda else None)  # job.model: DDP, made again after a recovery


def say_resumed(index, epoch):
    """A restarted process, at its first step: where it resumed, and how long after the demo's kill."""
    killed, since = os.path.join(ckpt_dir, "killed_at"), ""  # written by the --crash-at-epoch hook (the demo)
    if os.path.exists(killed):
        with open(killed) as f:
            since = f"; training again {time.time() - float(f.read()):.1f} s after rank {args.crash_rank} was killed"
    if job.joining:  # in place: a survivor sent the state
        log(f"received the state from a survivor at step {index} (epoch {epoch}){since}")
    elif index > 0:  # the launcher's copy in memory, taken at every step, is newer than the checkpoint
        log(f"resumed at step {index} (epoch {epoch}) from the launcher's copy in memory, not a checkpoint{since}")
    elif loaded:
        log(f"resumed from {loaded}{since}")


def save_atomically(obj, path):
    """Write to a temp file, then rename: a reader sees the old file or the new, never half."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic on POSIX, within one filesystem


# --- 5. Train. -------------------------------------------------------------------------------
said = attempt == 0  # a restarted process says where it resumed at its first step (`job` resumes it there)
for epoch in job.epochs(range(start_epoch, args.epochs + 1)):  # a replacement resumes the epoch in flight
    sampler.set_epoch(epoch)  # a new shuffle each epoch, identical on every attempt
    torch.manual_seed(args.seed + 1000 * epoch + rank)  # dropout masks: a function of the epoch
    job.model.train()
    t0, seen = time.perf_counter(), 0
    loss_sum = torch.zeros((), device=device)  # kept on the device: no sync per step
    correct = torch.zeros((), device=device)
    for i, step in enumerate(job.steps(loader)):  # a step per batch; resumed at the batch in flight
        if not said:
            said = True
            say_resumed(step.index, epoch)
        x, y = step.batch
        if epoch == args.crash_at_epoch and rank == args.crash_rank and attempt == 0 and i == len(loader) // 2:
            print(f"rank {rank}: test hook, killing myself halfway through epoch {epoch}", flush=True)
            with open(os.path.join(ckpt_dir, "killed_at"), "w") as f:  # the resumed rank 0 says how long it took
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with step:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=use_cuda):
                out = job.model(x)
                loss = nn.functional.cross_entropy(out, y)
            scaler.scale(loss).backward()  # DDP averages the gradients across ranks here
            scaler.step(optimizer)  # the step's commit point: a peer lost after it does not make it run twice
            scaler.update()
            time.sleep(args.step_time)
            loss_sum += loss.detach().float() * len(y)
            correct += (out.argmax(1) == y).sum()
            seen += len(y)
    # Each rank only knows its own shard: average loss and accuracy over ranks for the log.
    warned = torch.tensor(float(bool(WARNED)), device=device)
    stats = torch.stack([loss_sum / seen, correct / seen, warned])
    dist.all_reduce(stats)  # sum over ranks...
    stats[:2] /= world  # ...divided by the number of ranks
    if stats[2] > 0:  # any rank was warned: every rank checkpoints this epoch
        log(f"pre-emption warning (SIGUSR1): checkpointing after epoch {epoch} and carrying on")
        WARNED.clear()
    elapsed = time.perf_counter() - t0
    log(
        f"epoch {epoch}/{args.epochs}  loss {stats[0]:.4f}  acc {stats[1]:.3f}  {seen * world / elapsed:,.0f} samples/s"
    )

    if epoch % args.checkpoint_every == 0 or epoch == args.epochs or stats[2] > 0:
        if rank == 0:
            save_atomically(
                {
                    "epoch": epoch,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(),
                },
                ckpt_path,
            )
        # Nobody starts the next epoch (where it could fail) until the checkpoint is on disk.
        dist.barrier(device_ids=[local_rank] if use_cuda else None)

# --- 6. Done: rank 0 keeps the final weights; everyone leaves the group. --------------------
if rank == 0 and args.out:
    save_atomically(model.state_dict(), args.out)
    log(f"final weights saved to {os.path.abspath(args.out)}")
dist.barrier()  # torch 2.13's gloo can abort a rank that tears down while a peer still talks
job.close()  # in place: the job's end, where every rank meets (a rank lost before it comes back)
