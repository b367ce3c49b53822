"""Write $DUMP_DIR/<attempt>-<rank> (pid, forked?) and wait; on attempt 0, rank 0 exits 1 once $DUMP_DIR/go exists."""

import os
import sys
import time

e = os.environ
attempt, rank, out = e["TORCHELASTIC_RESTART_COUNT"], e["RANK"], e["DUMP_DIR"]
forked = "launcher.agent.zygote" in open("/proc/self/cmdline").read()
with open(os.path.join(out, f"{attempt}-{rank}.tmp"), "w") as f:
    f.write(f"{os.getpid()} {int(forked)}")
os.rename(os.path.join(out, f"{attempt}-{rank}.tmp"), os.path.join(out, f"{attempt}-{rank}"))
if attempt != "0":
    sys.exit(0)
while True:
    if rank == "0" and os.path.exists(os.path.join(out, "go")):
        sys.exit(1)
    time.sleep(0.02)
