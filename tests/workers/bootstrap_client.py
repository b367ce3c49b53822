"""What init_process_group does with the bootstrap store, through the launcher's client (no torch):
connect to MASTER_ADDR:MASTER_PORT, count in, rank 0 sets an id that every rank reads; then sleep
$SLEEP s. Rank $FAIL_RANK kills itself (SIGKILL) $FAIL_AFTER s into attempt 0."""

import os
import signal
import time

from launcher.tcpstore import StoreClient

e = os.environ
rank, attempt = e["RANK"], e["TORCHELASTIC_RESTART_COUNT"]
store = StoreClient(e["MASTER_ADDR"], int(e["MASTER_PORT"]), timeout=60)
store.add(f"init/{attempt}", 1)
if rank == "0":
    store.set(f"uid/{attempt}", b"x" * 128)
store.get(f"uid/{attempt}")
print(f"info rank={rank} restart={attempt} bootstrapped", flush=True)
if e.get("FAIL_RANK") == rank and attempt == "0":
    time.sleep(float(e.get("FAIL_AFTER", "1")))
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(float(e.get("SLEEP", "1")))
store.close()
