"""Worker: gloo init and all_reduce; on the first attempt the last rank exits 1 right after init.

Only a restart that re-initialises cleanly (a fresh store, every node restarted) succeeds.
"""

import os
import sys

import torch
import torch.distributed as dist

restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
if restart == "0" and rank == world - 1:
    sys.exit(1)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"reduced rank={rank} restart={restart} sum={t.item():g}", flush=True)
dist.barrier()
dist.destroy_process_group()
