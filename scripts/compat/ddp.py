"""Worker: DDP on gloo, one step, an all_reduce checked; exits normally (interpreter teardown included).

Prints `forked=True` when it was forked from the --preload zygote, so that the check knows it was.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
model(torch.full((2, 4), float(rank + 1))).sum().backward()
grads = [p.grad.clone() for p in model.parameters()]
t = torch.tensor([float(rank)])
dist.all_reduce(t)
assert t.item() == sum(range(world)), t
gathered = [torch.zeros_like(grads[0]) for _ in range(world)]
dist.all_gather(gathered, grads[0])
assert all(torch.equal(g, gathered[0]) for g in gathered), "DDP left the ranks' gradients different"
forked = "launcher.agent.zygote" in open("/proc/self/cmdline").read()
print(f"ddp ok rank={rank} world={world} forked={forked} pid={os.getpid()}", flush=True)
dist.barrier()
dist.destroy_process_group()
