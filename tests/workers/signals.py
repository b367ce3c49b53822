"""Note every SIGTERM/SIGINT/SIGUSR1 in $MARK_DIR/<rank> and keep running for $SLEEP s.

A signal named in $IGNORE (e.g. "SIGINT,SIGTERM") or SIGUSR1 is only noted; any other
makes the worker note "exit" and exit 128+signum, $EXIT_DELAY s later.
"""

import os
import signal
import sys
import time

path = os.path.join(os.environ["MARK_DIR"], os.environ["RANK"])
ignore = set(os.environ.get("IGNORE", "").split(","))
stop = []


def note(word):
    with open(path, "a") as f:
        f.write(word + "\n")


def handler(signum, _frame):
    name = signal.Signals(signum).name
    note(name)
    if name not in ignore and signum != signal.SIGUSR1:
        stop.append(signum)


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(sig, handler)
note("ready")
deadline = time.monotonic() + float(os.environ.get("SLEEP", "30"))
while time.monotonic() < deadline:
    if stop:
        time.sleep(float(os.environ.get("EXIT_DELAY", "0")))
        note("exit")
        sys.exit(128 + stop[0])
    time.sleep(0.02)
note("done")
