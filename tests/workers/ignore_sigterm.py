"""Rank 1 ignores SIGTERM and sleeps; rank 0 exits 1 once rank 1 is ignoring ($MARK_DIR/1.ready)."""

import os
import signal
import sys
import time

ready = os.path.join(os.environ["MARK_DIR"], "1.ready")
if os.environ["RANK"] == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(ready, "w").close()
    time.sleep(60)
else:
    deadline = time.monotonic() + 20
    while not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(1)
