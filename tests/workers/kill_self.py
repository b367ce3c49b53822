"""Rank 0 kills itself with SIGKILL (what the OOM killer does); the other ranks sleep."""

import os
import signal
import time

if os.environ["RANK"] == "0":
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(30)
