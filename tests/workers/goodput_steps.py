"""A training loop with known losses, for the goodput tests.

STEPS steps of STEP_TIME s, `launcher.progress(step=)` after each; a checkpoint every CKPT_EVERY
steps in $CKPT_DIR/ckpt<rank> (each rank its own), resumed from on every attempt. On attempt 0,
rank FAIL_RANK exits 7 when it is about to do step FAIL_AT (it reached FAIL_AT - 1).
START_TIME: seconds of "loading" before the first step (every attempt). NO_PROGRESS=1: no progress()
call (a plain torchrun script). Prints "step rank= n=" every step.
"""

import os
import sys
import time

import launcher

e = os.environ
rank = int(e["RANK"])
steps, step_time = int(e.get("STEPS", "30")), float(e.get("STEP_TIME", "0.1"))
every = int(e.get("CKPT_EVERY", "10"))
ckpt = os.path.join(e["CKPT_DIR"], f"ckpt{rank}")
fail_rank, fail_at = int(e.get("FAIL_RANK", "-1")), int(e.get("FAIL_AT", "-1"))
attempt = int(e["TORCHELASTIC_RESTART_COUNT"])

try:
    with open(ckpt) as f:
        start = int(f.read())
except FileNotFoundError:
    start = 0
time.sleep(float(e.get("START_TIME", "0")))
t0 = time.monotonic()
for step in range(start + 1, steps + 1):
    if rank == fail_rank and step == fail_at and attempt == 0:
        sys.exit(7)
    # a fixed schedule, so the rate holds under load: step n ends at t0 + (n - start) * STEP_TIME
    time.sleep(max(0.0, t0 + (step - start) * step_time - time.monotonic()))
    if step % every == 0:
        with open(ckpt + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(ckpt + ".tmp", ckpt)
    if not e.get("NO_PROGRESS"):
        launcher.progress(step=step)
    print(f"step rank={rank} n={step}", flush=True)
print(f"done rank={rank} from={start}", flush=True)
