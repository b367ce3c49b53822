"""In-place recovery that cannot finish: rank 1 exits 1 in round 0; neither the others nor its
replacement (round 1) join the next round, so the launcher's --in_place_timeout passes and it
restarts the group; in that round (2) every rank exits 0."""

import os
import sys
import time

rnd = os.environ["LAUNCHER_ROUND"]
if rnd == "0" and os.environ["RANK"] == "1":
    sys.exit(1)
if rnd == "2":
    sys.exit(0)
time.sleep(60)
