"""Fails on each attempt as the environment says, for the restart-policy tests (one rank is enough).

REACH=a,b,c: attempt i calls launcher.progress(step=) with REACH[i] (the last entry on later attempts)
before it fails. ERROR: the message it raises on every attempt (default: a new one per attempt, so
that no two failures look alike). OK_ON=i: attempt i exits 0 instead. MARK=path: appends "attempt i".
HEALTHY=S: never fails; prints "healthy", sleeps S s and exits 0 (a node whose workers are fine).
"""

import os
import time

from launcher import progress, record

e = os.environ
attempt = int(e["TORCHELASTIC_RESTART_COUNT"])


@record
def main():
    if e.get("HEALTHY"):
        print("healthy", flush=True)
        time.sleep(float(e["HEALTHY"]))
        return
    if e.get("MARK"):
        with open(e["MARK"], "a") as f:
            f.write(f"attempt {attempt}\n")
    reach = [int(s) for s in e.get("REACH", "").split(",") if s]
    if reach:
        progress(step=reach[min(attempt, len(reach) - 1)])
    if e.get("OK_ON") == str(attempt):
        return
    raise RuntimeError(e.get("ERROR") or f"error number {attempt}")


if __name__ == "__main__":
    main()
