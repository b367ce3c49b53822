"""init_process_group("gloo", env://) and all_reduce; rank 1 then exits 1 on the first attempt
while rank 0 waits to be stopped, so only a restart that re-initialises cleanly succeeds."""
import os
import sys
import time

import torch
import torch.distributed as dist

restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"reduced rank={rank} restart={restart} port={os.environ['MASTER_PORT']} sum={t.item():g}", flush=True)
if restart == "0":
    if rank == 1:
        sys.exit(1)
    time.sleep(60)  # stopped by the launcher
dist.destroy_process_group()
