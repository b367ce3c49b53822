"""A worker written for torchrun's contract: with TORCHELASTIC_USE_AGENT_STORE=True every rank is
a TCPStore *client* of MASTER_ADDR:MASTER_PORT (torchelastic's create_c10d_store(is_server=False)).

MODE=client: that, then init_process_group(store=...); MODE=env: init_process_group("env://"),
which does the same under that variable. Then one gloo all_reduce. Each round writes a key and
checks the previous round's is absent (a fresh store every round). Rank $FAIL_RANK exits 3 in
round 0, after the all_reduce.
"""

import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.utils.distributed import create_c10d_store

e = os.environ
rank, world, rnd = int(e["RANK"]), int(e["WORLD_SIZE"]), int(e["LAUNCHER_ROUND"])
timeout = float(e.get("STORE_TIMEOUT", "20"))
if e.get("MODE", "client") == "client":
    store = create_c10d_store(
        is_server=False,
        server_addr=e["MASTER_ADDR"],
        server_port=int(e["MASTER_PORT"]),
        world_size=world,
        timeout=timeout,
    )
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
    )
else:
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=timeout))
    store = dist.distributed_c10d._get_default_store()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
store.set(f"round/{rnd}/{rank}", "x")
stale = rnd > 0 and store.check([f"round/{rnd - 1}/{rank}"])
print(
    f"rank={rank} round={rnd} sum={int(t.item())} agent_store={e['TORCHELASTIC_USE_AGENT_STORE']} stale={stale}",
    flush=True,
)
dist.barrier()
if rnd == 0 and e.get("FAIL_RANK") == str(rank):
    os._exit(3)
dist.destroy_process_group()
