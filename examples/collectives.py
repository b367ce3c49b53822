"""Run every point-to-point and collective op once, check the result on every rank, print a table.

    python -m launcher --nproc_per_node 3 examples/collectives.py

gloo on CPU, nccl with one GPU per worker (LOCAL_RANK) when CUDA is there. Each op works on
small tensors whose values depend on the rank, so a wrong source, a wrong root or a missing
contribution shows up. Every rank checks what it got; rank 0 prints, per op, how many ranks
agreed and the slowest rank's time. The exit status is 1 on every rank if any check failed.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

if "RANK" not in os.environ:
    sys.exit("run me under the launcher: python -m launcher --nproc_per_node 3 examples/collectives.py")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])
if torch.cuda.is_available():
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method="env://", device_id=device)
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo", init_method="env://")

N = 4  # elements per tensor


def value(r):
    """The tensor rank r contributes: [100r, 100r+1, ...], distinct per rank and per element."""
    return torch.arange(N, dtype=torch.float32, device=device) + 100 * r


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Each check runs the op on this rank and returns True if the result is right here.
def send_recv():
    # A ring: send to the next rank, receive from the previous, as one batch so no rank blocks in
    # send while its neighbour also sends; NCCL takes a send to itself (world size 1) only batched.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got = torch.empty(N, device=device)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, value(rank), nxt), dist.P2POp(dist.irecv, got, prv)])
    for r in reqs:
        r.wait()
    return torch.equal(got, value(prv))


def broadcast():
    src = world - 1  # not rank 0, to catch a root that is ignored
    t = value(rank)
    dist.broadcast(t, src=src)
    return torch.equal(t, value(src))


def scatter():
    got = torch.empty(N, device=device)
    chunks = [value(r) for r in range(world)] if rank == 0 else None  # only the source has them
    dist.scatter(got, chunks, src=0)
    return torch.equal(got, value(rank))


def gather():
    dst = world - 1
    out = [torch.empty(N, device=device) for _ in range(world)] if rank == dst else None
    dist.gather(value(rank), out, dst=dst)
    return rank != dst or all(torch.equal(out[r], value(r)) for r in range(world))


def reduce():
    t = value(rank)
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)  # only the destination's result is defined
    return rank != 0 or torch.equal(t, sum(value(r) for r in range(world)))


def all_gather():
    out = [torch.empty(N, device=device) for _ in range(world)]
    dist.all_gather(out, value(rank))
    return all(torch.equal(out[r], value(r)) for r in range(world))


def all_reduce_sum():
    t = value(rank)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return torch.equal(t, sum(value(r) for r in range(world)))


def all_reduce_max():
    t = value(rank)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return torch.equal(t, value(world - 1))


def barrier():
    # The last rank arrives late and leaves a mark in the job's store first. A barrier that let
    # anyone through before the last rank got there would leave that rank without the mark.
    store = dist.distributed_c10d._get_default_store()  # the store init_process_group used
    if rank == world - 1:
        time.sleep(0.1)
        store.set("collectives/late-rank-arrived", "1")
    dist.barrier(device_ids=[local_rank] if device.type == "cuda" else None)
    return store.check(["collectives/late-rank-arrived"])


CHECKS = [
    ("send/recv", send_recv),
    ("broadcast", broadcast),
    ("scatter", scatter),
    ("gather", gather),
    ("reduce", reduce),
    ("all_gather", all_gather),
    ("all_reduce sum", all_reduce_sum),
    ("all_reduce max", all_reduce_max),
    ("barrier, 1 late", barrier),
]
if world == 1 and device.type == "cpu":
    # gloo opens no connection from a rank to itself: one rank has no point-to-point to check
    CHECKS = CHECKS[1:]

ok = torch.zeros(len(CHECKS), device=device)
seconds = torch.zeros(len(CHECKS), device=device, dtype=torch.float64)
for i, (name, check) in enumerate(CHECKS):
    t0 = time.perf_counter()
    try:
        passed = check()
    except Exception as e:  # a failing op should fail its row, not hide the rest of the table
        print(f"rank {rank}: {name} raised {type(e).__name__}: {e}", flush=True)
        passed = False
    sync()
    seconds[i] = time.perf_counter() - t0
    ok[i] = float(passed)
    if not passed:
        print(f"rank {rank}: {name} gave a wrong result", flush=True)

# One all_reduce each to collect the verdicts (how many ranks passed) and the slowest times.
dist.all_reduce(ok, op=dist.ReduceOp.SUM)
dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
all_ok = bool((ok == world).all())
if rank == 0:
    print(f"{'op':<18}{'ok':<10}{'time (slowest rank)':>20}")
    for i, (name, _) in enumerate(CHECKS):
        verdict = "yes" if ok[i] == world else f"NO {int(ok[i])}/{world}"
        print(f"{name:<18}{verdict:<10}{seconds[i].item() * 1e3:>17.2f} ms")
    print(
        f"{'all ' + str(len(CHECKS)) + ' checks passed' if all_ok else 'SOME CHECKS FAILED'} "
        f"on {world} ranks ({dist.get_backend()}, {device.type})",
        flush=True,
    )
dist.barrier()  # torch 2.13's gloo can abort a rank that tears down while a peer still talks
dist.destroy_process_group()
sys.exit(0 if all_ok else 1)
