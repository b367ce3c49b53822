"""A plain torchrun script, for goodput without the script's help: no launcher.progress(), no Job.
Forms the default group from env:// (gloo), all-reduces STEPS times, STEP_TIME s apart. On attempt 0,
rank 1 writes the time to $MARK and SIGKILLs itself at step 10; on a later attempt, rank 0 prints
"formed X s after the kill" once its group has formed (what the launcher books as the restart)."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

e = os.environ
attempt, mark = int(e["TORCHELASTIC_RESTART_COUNT"]), e["MARK"]
dist.init_process_group("gloo")
rank = dist.get_rank()
if attempt > 0 and rank == 0:
    with open(mark) as f:
        print(f"formed {time.time() - float(f.read()):.3f} s after the kill", flush=True)
t = torch.ones(1)
for i in range(int(e.get("STEPS", "40"))):
    if attempt == 0 and rank == 1 and i == 10:
        with open(mark, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)
    time.sleep(float(e.get("STEP_TIME", "0.05")))
print(f"done rank={rank}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # before torch 2.13's gloo teardown abort (pytorch#190489)
