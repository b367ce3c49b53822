"""A torch-free checkpointing loop for the spare tests.

STEPS steps of STEP_TIME s; rank 0 saves the step count to $CKPT_DIR/ckpt.json after each step and every
attempt resumes from it. With GATE=PATH every rank waits, before its last step, until PATH exists, so a
test decides when the job may end. FAIL_AT=R:S: rank R exits 5 at step S (every attempt), and the other
ranks block at step S as in a collective with a dead peer, until the launcher stops them.
Lines: "start rank= group= world= restart= round= from=", "step rank= n=", "done rank= world=".
"""

import json
import os
import sys
import time

e = os.environ
rank, world, group = int(e["RANK"]), int(e["WORLD_SIZE"]), e["GROUP_RANK"]
restart, rnd = e["TORCHELASTIC_RESTART_COUNT"], e["LAUNCHER_ROUND"]
steps, step_time = int(e.get("STEPS", "20")), float(e.get("STEP_TIME", "0.05"))
ckpt = os.path.join(e["CKPT_DIR"], "ckpt.json")
fail_rank, _, fail_step = e.get("FAIL_AT", "-1:-1").partition(":")


def load() -> int:
    try:
        with open(ckpt) as f:
            return json.load(f)["step"]
    except FileNotFoundError:
        return 0


start = load()
print(f"start rank={rank} group={group} world={world} restart={restart} round={rnd} from={start}", flush=True)
for step in range(start + 1, steps + 1):
    if step == steps and e.get("GATE"):
        while not os.path.exists(e["GATE"]):
            time.sleep(0.05)
    time.sleep(step_time)
    if step == int(fail_step):
        if rank == int(fail_rank):
            sys.exit(5)
        time.sleep(3600)
    if rank == 0:
        tmp = f"{ckpt}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step, "world": world}, f)
        os.replace(tmp, ckpt)
    print(f"step rank={rank} n={step}", flush=True)
print(f"done rank={rank} world={world}", flush=True)
