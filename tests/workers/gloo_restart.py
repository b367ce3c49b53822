"""init_process_group("gloo", env://), then all_reduce. On the first attempt rank 1 exits 1 right
after init, so rank 0's all_reduce fails: only a restart that re-initialises cleanly succeeds
(torchrun 2.13 reuses its store and MASTER_PORT, and the second init fails on stale keys)."""

import os
import sys

import torch
import torch.distributed as dist

restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
print(f"joined rank={rank} restart={restart} port={os.environ['MASTER_PORT']}", flush=True)
if restart == "0" and rank == 1:
    sys.exit(1)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"reduced rank={rank} restart={restart} sum={t.item():g}", flush=True)
dist.barrier()  # torch 2.13's gloo can abort a rank that tears down while a peer still talks
dist.destroy_process_group()
# torch 2.13's gloo can still abort at interpreter teardown (pytorch#190489); this test is about the
# launcher, so leave before it: output is flushed, the process group destroyed.
sys.stdout.flush()
os._exit(0)
