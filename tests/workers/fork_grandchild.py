"""Start a grandchild in its own session (`sleep 60`), write its pid to $MARK_DIR/<rank>.pid, wait
for every rank's pid file, stay $STAY s and exit $CODE: the grandchild outlives this worker
unless the launcher kills it."""

import os
import subprocess
import sys
import time

mark_dir = os.environ["MARK_DIR"]
child = subprocess.Popen(["sleep", "60"], start_new_session=True)
path = os.path.join(mark_dir, os.environ["RANK"] + ".pid")
with open(path + ".tmp", "w") as f:
    f.write(str(child.pid))
os.replace(path + ".tmp", path)
deadline = time.monotonic() + 20
while time.monotonic() < deadline and not all(
    os.path.exists(os.path.join(mark_dir, f"{r}.pid")) for r in range(int(os.environ["WORLD_SIZE"]))
):
    time.sleep(0.02)
time.sleep(float(os.environ.get("STAY", "0")))
sys.exit(int(os.environ.get("CODE", "0")))
