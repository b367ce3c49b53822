"""Print this worker's place in the job, sleep $SLEEP s; rank $FAIL_RANK exits 5 on attempt 0."""

import os
import sys
import time

e = os.environ
print(
    f"info rank={e['RANK']} world={e['WORLD_SIZE']} group={e['GROUP_RANK']}/{e['GROUP_WORLD_SIZE']} "
    f"local={e['LOCAL_RANK']}/{e['LOCAL_WORLD_SIZE']} restart={e['TORCHELASTIC_RESTART_COUNT']} "
    f"round={e['LAUNCHER_ROUND']} master={e['MASTER_ADDR']}:{e['MASTER_PORT']}",
    flush=True,
)
if e.get("FAIL_RANK") == e["RANK"] and e["TORCHELASTIC_RESTART_COUNT"] == "0":
    time.sleep(float(e.get("FAIL_AFTER", "0.3")))
    sys.exit(5)
time.sleep(float(e.get("SLEEP", "1")))
