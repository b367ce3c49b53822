"""Start a grandchild in its own session (`sleep 60`), write its pid to $MARK_DIR/<rank>.pid,
then stay $STAY s and exit $CODE: the grandchild outlives this worker unless the launcher kills it."""
import os
import subprocess
import sys
import time

child = subprocess.Popen(["sleep", "60"], start_new_session=True)
path = os.path.join(os.environ["MARK_DIR"], os.environ["RANK"] + ".pid")
with open(path + ".tmp", "w") as f:
    f.write(str(child.pid))
os.replace(path + ".tmp", path)
time.sleep(float(os.environ.get("STAY", "0")))
sys.exit(int(os.environ.get("CODE", "0")))
