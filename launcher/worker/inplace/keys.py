"""What the agent and its workers share for in-place recovery: store keys and one variable (no torch here).

The keys live in the bootstrap store (MASTER_ADDR:MASTER_PORT), which the agent serves and keeps
open across in-place rounds; each round's process group lives under its own prefix of it.
"""

from __future__ import annotations

RECOVERY_VAR = "LAUNCHER_RECOVERY"  # "in-place" in every worker's environment when the agent recovers in place
IN_PLACE = "in-place"
NOTICE_VAR = "LAUNCHER_INPLACE_NOTICE"  # seconds a worker waits for the agent's word after a peer's error
NAMESPACE = "launcher/inplace"
NEWEST = f"{NAMESPACE}/round"  # the newest in-place round the agent opened (a decimal number)


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


def group_prefix(rnd: int) -> str:
    """Where round `rnd`'s process group meets (torch's PrefixStore adds the '/')."""
    return f"{NAMESPACE}/{rnd}/pg"
