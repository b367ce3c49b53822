"""What the agent and its workers share for in-place recovery: store keys and one variable (no torch here).

The keys live in the bootstrap store (MASTER_ADDR:MASTER_PORT), which the agent serves and keeps
open across in-place rounds; each round's process group lives under its own prefix of it.
"""

from __future__ import annotations

import os

RECOVERY_VAR = "LAUNCHER_RECOVERY"  # "in-place" in every worker's environment when the agent recovers in place
IN_PLACE = "in-place"
NOTICE_VAR = "LAUNCHER_INPLACE_NOTICE"  # seconds a worker waits for the agent's word after a peer's error
NAMESPACE = "launcher/inplace"
NEWEST = f"{NAMESPACE}/round"  # the newest in-place round the agent opened (a decimal number)
HELD = f"{NAMESPACE}/held"  # set once a round was whole: some rank holds the job's state (a replacement receives it)
SLOTS_VAR = "LAUNCHER_INPLACE_SLOTS"  # a folder in memory (/dev/shm), the agent's, where each rank keeps its own state
# A worker that cannot go on in place (a lost peer outside `with step:`, a step torn between two kept
# optimizers) exits with this code after one line: the agent restarts the group, charging nothing more
# when a recovery is under way (the fault was charged already).
LEAVE_EXIT = 86
# A worker whose join of a round is stuck on a rank lost since (gloo retries a peer's refused address until
# its timeout) exits with this code after one line: the agent starts it again in the round after, in place,
# charging nothing more (the loss it waits on was charged).
REJOIN_EXIT = 87


def opened(rnd: int) -> str:
    """Set by the agent when round `rnd` opens: the survivors' wake-up."""
    return f"{NAMESPACE}/{rnd}/open"


def joined(rnd: int) -> str:
    """A counter each worker adds 1 to once it joined round `rnd` and holds the job's state."""
    return f"{NAMESPACE}/{rnd}/joined"


def ready(rnd: int) -> str:
    """Set by the last worker to join round `rnd`: the round is whole, every rank steps again."""
    return f"{NAMESPACE}/{rnd}/ready"


def declined(rnd: int) -> str:
    """Set by an agent that restarts its workers rather than keep them past round `rnd` (its reason): the
    other nodes do not wait in place for workers that will not come."""
    return f"{NAMESPACE}/{rnd}/declined"


def entering(rnd: int, rank: int) -> str:
    """Set by a worker right before it joins round `rnd`'s process group: a rank lost before that left
    nothing of itself in the round, and its replacement can take its seat in the same round."""
    return f"{NAMESPACE}/{rnd}/entering/{rank}"


def closing(rnd: int) -> str:
    """A counter each worker adds 1 to once it reached the job's end (`Job.close`) in round `rnd`."""
    return f"{NAMESPACE}/{rnd}/closing"


def finished(rnd: int) -> str:
    """Set by the last worker to reach the job's end in round `rnd`: the training is over; a worker lost
    after it costs nothing and runs nothing again."""
    return f"{NAMESPACE}/{rnd}/finished"


def finished_file(folder: str, rnd: int) -> str:
    """The same word in the node's memory folder (`SLOTS_VAR`), from a worker that saw `finished(rnd)`: its
    agent knows the job is over when the store is gone (group rank 0's node may exit first)."""
    return os.path.join(folder, f"finished.{rnd}")


SLOTS = f"{NAMESPACE}/slot/"  # every rank's record (`slot`): the one thing a group restart's fresh store keeps


def slot(rank: int) -> str:
    """A copy of rank `rank`'s own record (slots.py), for a replacement on another node (a spare's)."""
    return f"{SLOTS}{rank}"


def group_prefix(rnd: int) -> str:
    """Where round `rnd`'s process group meets (torch's PrefixStore adds the '/')."""
    return f"{NAMESPACE}/{rnd}/pg"
