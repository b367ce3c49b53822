"""Steps forever (or $STEPS), calling launcher.progress(step=) after each $STEP_TIME s sleep;
rank $SLOW_RANK sleeps $SLOW_TIME instead."""

import os
import time

import launcher

slow = os.environ.get("SLOW_RANK") == os.environ["RANK"]
for step in range(int(os.environ.get("STEPS", "100000"))):
    time.sleep(float(os.environ.get("SLOW_TIME" if slow else "STEP_TIME", "0.05")))
    launcher.progress(step=step)
