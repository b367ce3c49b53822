"""Print rank and restart count on stdout and stderr; rank $FAIL_RANK exits $CODE after $DELAY s
(on every attempt, or only on attempt $FAIL_ON); the other ranks sleep $SLEEP s and exit 0."""

import os
import sys
import time

e = os.environ
restart = e["TORCHELASTIC_RESTART_COUNT"]
print(f"out rank={e['RANK']} restart={restart}", flush=True)
print(f"err rank={e['RANK']} restart={restart}", file=sys.stderr, flush=True)
if e.get("FAIL_RANK") == e["RANK"] and e.get("FAIL_ON", restart) == restart:
    time.sleep(float(e.get("DELAY", "0.2")))
    sys.exit(int(e.get("CODE", "3")))
time.sleep(float(e.get("SLEEP", "30")))
