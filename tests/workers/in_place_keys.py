"""A worker that drives the in-place keys (launcher.worker.inplace.keys) the way `Job` does, with the launcher's
StoreClient alone (no torch, no process group): in each round it sets `entering`, adds to `joined` (the last
sets `ready`), waits for `ready`; at its end it adds to `closing` (the last sets `finished`) and waits for
`finished`. A process whose round the agent opened in place (`opened`) is a replacement. What a test asks:

VICTIM=R      rank R SIGKILLs itself in round 0 once every rank is in; the others wait for the agent's word
SECOND="R A"  survivor R, at that word (round 1 opened): A=kill SIGKILLs itself before entering round 1,
              A=leave exits keys.LEAVE_EXIT after one line
AFTER_END=R   rank R SIGKILLs itself after every rank finished the job (`finished` set); "R gone": once the
              store is gone too (its node, group rank 0's, exited: R must be on another node), within 60 s
FAIL=R        rank R exits 1 once every rank is in (round 0)
HOLD=1        every rank waits, once in, until the agent stops it
$LAUNCHER_INPLACE_SLOTS (set by the agent): each rank writes its pid to a file of its own there first.
Prints "in rank=R round=N slots=PATH" once in, "done rank=R round=N" at a clean end.
"""

import os
import signal
import socket
import sys
import time

from launcher.tcpstore.client import StoreClient
from launcher.worker.inplace import keys

e = os.environ
rank, world, rnd = int(e["RANK"]), int(e["WORLD_SIZE"]), int(e["LAUNCHER_ROUND"])
store = StoreClient(e["MASTER_ADDR"], int(e["MASTER_PORT"]), timeout=float(e.get("WAIT", "30")))
second = e.get("SECOND", "").split()
slots = e.get(keys.SLOTS_VAR, "")
if slots:
    with open(os.path.join(slots, str(rank)), "w") as f:
        f.write(str(os.getpid()))


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def join(r: int) -> None:
    store.set(keys.entering(r, rank), b"1")
    if store.add(keys.joined(r), 1) == world:
        store.set(keys.ready(r), b"1")


fresh = not store.check([keys.opened(rnd)])
join(rnd)
store.wait([keys.ready(rnd)])
print(f"in rank={rank} round={rnd} slots={slots}", flush=True)
if e.get("HOLD"):
    store.wait(["never"], timeout=3600)
if fresh and rnd == 0 and e.get("FAIL") == str(rank):
    sys.exit(1)
if fresh and rnd == 0 and e.get("VICTIM"):
    if e["VICTIM"] == str(rank):
        die()
    store.wait([keys.opened(1)])  # the agent's word: round 1 recovers in place
    if second and second[0] == str(rank):
        if second[1] == "kill":
            die()
        if second[1] == "leave":
            print(f"rank {rank}: cannot go on in place", flush=True)
            sys.exit(keys.LEAVE_EXIT)
    rnd = 1
    join(rnd)
    store.wait([keys.ready(rnd)])
if store.add(keys.closing(rnd), 1) == world:
    store.set(keys.finished(rnd), b"1")
store.wait([keys.finished(rnd)])
if slots:  # as Job.close() does: the word for this node's agent, should the store's node exit first
    open(keys.finished_file(slots, rnd), "wb").close()
after_end = e.get("AFTER_END", "").split()
if after_end and after_end[0] == str(rank):
    store.close()
    deadline = time.monotonic() + 60
    while after_end[1:] == ["gone"] and time.monotonic() < deadline:
        try:
            socket.create_connection((e["MASTER_ADDR"], int(e["MASTER_PORT"])), timeout=1).close()
        except OSError:
            break  # refused: the store's node exited
        time.sleep(0.05)  # the pace of the polling; the refused connection decides
    die()
print(f"done rank={rank} round={rnd}", flush=True)
