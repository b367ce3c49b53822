"""A seed-style DDP script: init from env://, one DDP step, all_reduce check, print the result."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", init_method="env://")
assert dist.is_torchelastic_launched()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
loss = model(torch.full((2, 4), float(rank + 1))).sum()
loss.backward()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
assert t.item() == sum(range(world)), t
print(f"ok rank={rank} world={world} sum={t.item():g}", flush=True)
dist.barrier()  # torch 2.13's gloo can abort a rank that tears down while a peer still talks
dist.destroy_process_group()
# torch 2.13's gloo can still abort at interpreter teardown (pytorch#190489); this test is about the
# launcher, so leave before it: output is flushed, the process group destroyed.
sys.stdout.flush()
os._exit(0)
