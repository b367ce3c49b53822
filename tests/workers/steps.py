"""A checkpointing training loop without torch, for the fault tests.

STEPS steps of STEP_TIME s each; every step prints one line and calls `launcher.progress()`; rank 0
saves the step count atomically to $CKPT_DIR/ckpt.json after each step, and every attempt resumes
from it. Lines: "start rank= world= restart= round= from=", "step rank= n=", "done rank= world= steps=".

Faults, chosen by the environment (each only on attempt 0 unless said otherwise):
  HANG=R:S       rank R stops at step S, silent, inside `stuck_in_collective` (no output, no progress)
  HANG_FILE=P    a rank that finds file P holding its rank takes it (renames it P.taken, on any attempt),
                 writes the epoch time of its last progress() to P.at and stops as HANG does
  FAIL_AT=R:S    rank R exits 5 at step S
  STOP=R:S       rank R stops itself (SIGSTOP: state T, as a debugger or an operator's kill -STOP leaves it) at
                 step S, before its progress() call; nothing resumes it
  FAIL_EVERY=T   rank 0 exits 3 after T s, on every attempt, until the epoch time SOAK_UNTIL; after
                 that every rank exits 0 at once (the soak)
  PID_DIR=D      write D/<rank>.pid (the worker's pid) at start
  SPAM=N         print N lines of 1 KiB at start (fills a small --log_dir)
"""

import json
import os
import signal
import sys
import time

from launcher import progress

e = os.environ
rank, world = int(e["RANK"]), int(e["WORLD_SIZE"])
restart, rnd = e["TORCHELASTIC_RESTART_COUNT"], e["LAUNCHER_ROUND"]
steps, step_time = int(e.get("STEPS", "20")), float(e.get("STEP_TIME", "0.1"))
ckpt = os.path.join(e["CKPT_DIR"], "ckpt.json") if e.get("CKPT_DIR") else None


def load() -> int:
    if not ckpt:
        return 0
    try:
        with open(ckpt) as f:
            return json.load(f)["step"]
    except FileNotFoundError:
        return 0


def save(step: int) -> None:
    tmp = f"{ckpt}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "world": world, "round": int(rnd)}, f)
    os.replace(tmp, ckpt)


def stuck_in_collective() -> None:
    time.sleep(3600)  # what a rank waiting for a dead peer looks like


if e.get("PID_DIR"):
    with open(os.path.join(e["PID_DIR"], f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))

if e.get("FAIL_EVERY"):
    if time.time() >= float(e["SOAK_UNTIL"]):
        print(f"done rank={rank} world={world} steps=0", flush=True)
        sys.exit(0)
    if rank == 0:
        time.sleep(float(e["FAIL_EVERY"]))
        sys.exit(3)
    time.sleep(3600)

for _ in range(int(e.get("SPAM", "0"))):
    print(f"spam rank={rank} " + "x" * 1000)
start = load()
print(f"start rank={rank} world={world} restart={restart} round={rnd} from={start}", flush=True)
hang_rank, _, hang_step = e.get("HANG", "-1:-1").partition(":")
fail_rank, _, fail_step = e.get("FAIL_AT", "-1:-1").partition(":")
stop_rank, _, stop_step = e.get("STOP", "-1:-1").partition(":")
hang_file = e.get("HANG_FILE")
last_progress = time.time()


def hang_asked() -> bool:
    """Whether the harness asked this rank to hang now (HANG_FILE): once, by taking the file."""
    try:
        with open(hang_file) as f:
            if f.read().strip() != str(rank):
                return False
        os.rename(hang_file, f"{hang_file}.taken")
    except OSError:  # no file, or another rank took it first
        return False
    with open(f"{hang_file}.at", "w") as f:
        f.write(repr(last_progress))
    return True


for step in range(start + 1, steps + 1):
    time.sleep(step_time)
    if rank == int(hang_rank) and step == int(hang_step) and restart == "0":
        stuck_in_collective()
    if hang_file and hang_asked():
        stuck_in_collective()
    if rank == int(fail_rank) and step == int(fail_step) and restart == "0":
        sys.exit(5)
    if rank == int(stop_rank) and step == int(stop_step) and restart == "0":
        os.kill(os.getpid(), signal.SIGSTOP)
    if rank == 0 and ckpt:
        save(step)
    progress()
    last_progress = time.time()
    print(f"step rank={rank} n={step}", flush=True)
print(f"done rank={rank} world={world} steps={steps}", flush=True)
