"""The launcher's exit codes, in one table (docs/policy.md explains each).

0, 1, 2 and 128+N are the codes every launcher has. The three policy codes tell a scheduler what
to do next; they borrow sysexits.h numbers whose meaning fits, and no worker's own code is ever
passed through as one of them (a worker exiting 69, 70 or 75 gives 1).
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What the launcher's exit status tells a scheduler (Slurm's --requeue, systemd's Restart=)."""

    OK = 0  # every worker of the job exited 0
    FAILED = 1  # workers failed (with no restart budget, the root cause's own code 1-125 passes through)
    USAGE = 2  # bad flags or environment: one line says which; fix the command
    QUARANTINED = 69  # EX_UNAVAILABLE: this node is unhealthy or failed too often: drain it, run the job elsewhere
    DO_NOT_REQUEUE = 70  # EX_SOFTWARE: deterministic failure or no progress: requeueing repeats it
    REQUEUE = 75  # EX_TEMPFAIL: transient (restarts spent on varied failures, a node lost): requeue the job


POLICY_CODES = frozenset({ExitCode.QUARANTINED, ExitCode.DO_NOT_REQUEUE, ExitCode.REQUEUE})
MEANING = {
    ExitCode.QUARANTINED: "quarantined: drain this node",
    ExitCode.DO_NOT_REQUEUE: "do not requeue",
    ExitCode.REQUEUE: "requeue",
}
SIGNAL_BASE = 128


def for_signal(signum: int) -> int:
    """The code Slurm, systemd and shells expect from a process ended by `signum`."""
    return SIGNAL_BASE + signum


def passed_through(returncode: int) -> int:
    """A worker's own code as the launcher's: 1-125 as is, except the policy codes; anything else 1."""
    if 1 <= returncode <= 125 and returncode not in POLICY_CODES:
        return returncode
    return ExitCode.FAILED
