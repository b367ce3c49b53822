"""A worker that cannot go on in place says why in one line and exits with the code the agent reads
(keys.LEAVE_EXIT: the group restarts; keys.REJOIN_EXIT: started again in the next round)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, NoReturn

import torch.distributed as dist

from . import keys

PEER_WORDS = ("gloo", "nccl", "connection", "peer", "socket", "timed out", "timeout")


def say(rank: int, what: str) -> None:
    """One line on the worker's stderr."""
    sys.stderr.flush()
    # To the descriptor: torch's excepthook (init_process_group's) catches what the hooks it wraps print.
    os.write(2, f"rank {rank}: {what} (docs/in-place.md)\n".encode())


def from_peer(error: BaseException) -> bool:
    """Whether `error` may come from a lost peer (a distributed error, or words that say so): only then is
    the agent's word waited for (a script's own bug is reported at once)."""
    text = str(error).lower()
    return isinstance(error, getattr(dist, "DistError", ())) or any(word in text for word in PEER_WORDS)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


def exit_now(code: int) -> NoReturn:
    """Flush what can be flushed and end the process with `code`."""
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)


def install(job: Any) -> None:
    """`job`'s sys.excepthook: a lost peer outside `with step:` (an eval, a barrier) is one line and
    LEAVE_EXIT, not a traceback; any other error goes to the hook before it (`Job.fails` says which)."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        if job.fails(error):
            say(job.rank, f"a peer was lost outside `with step:` ({first_line(error)}); leaving, the group restarts")
            exit_now(keys.LEAVE_EXIT)  # past the excepthook an exit code cannot be chosen any more
        previous(kind, error, tb)

    sys.excepthook = hook
