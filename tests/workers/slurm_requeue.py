"""Note "ready", every SIGTERM/SIGUSR1 and "done"/"exit" in $MARK_DIR/<rank>; run 60 s in a job's
first run (SLURM_RESTART_COUNT unset or 0) and 0.5 s once Slurm has requeued it; exit 143 on SIGTERM."""

import os
import signal
import sys
import time

path = os.path.join(os.environ["MARK_DIR"], os.environ["RANK"])
stop = []


def note(word):
    with open(path, "a") as f:
        f.write(word + "\n")


def handler(signum, _frame):
    note(signal.Signals(signum).name)
    if signum == signal.SIGTERM:
        stop.append(signum)


signal.signal(signal.SIGTERM, handler)
signal.signal(signal.SIGUSR1, handler)
note("ready")
deadline = time.monotonic() + (60 if os.environ.get("SLURM_RESTART_COUNT", "0") == "0" else 0.5)
while time.monotonic() < deadline:
    if stop:
        note("exit")
        sys.exit(143)
    time.sleep(0.02)
note("done")
