"""Every rank fails the same way, the first to fail taking turns: on attempt a, rank a % WORLD_SIZE fails
at once, the others a moment later (the launcher stops them first). Each writes one error line on stderr,
the same on every rank and attempt, then a line on stdout that differs (what the restart policy must not
compare), and exits 3. No error file (no @record): the policy reads the stderr line."""

import os
import sys
import time

e = os.environ
rank, world, attempt = int(e["RANK"]), int(e["WORLD_SIZE"]), int(e["TORCHELASTIC_RESTART_COUNT"])
if rank != attempt % world:
    time.sleep(5)
print("ValueError: the batch has no labels", file=sys.stderr, flush=True)
print(f"rank {rank} gives up on attempt {attempt}", flush=True)
sys.exit(3)
