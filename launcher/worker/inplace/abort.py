"""Leaving a broken process group, per backend: the one place that knows how.

A survivor must leave the old group even while it is blocked in a collective on a peer that is
alive but left (it raised, and is recovering). `wake` runs on the watcher thread once the agent
opens the next round:
- NCCL: `ProcessGroup.abort()` aborts the communicators, which NCCL allows from another thread;
  the blocked call returns with an error. (Run on one H200, torch 2.11: a group destroyed and made
  again on a new prefix works; an abort of a communicator still forming, its peer absent, did not
  return within 60 s. A collective on a dead peer needs two GPUs to check.)
- gloo: neither `abort()` nor `shutdown()` wakes a blocked collective (torch 2.13, measured), and
  a survivor that raised keeps its group's sockets open (its pending work holds them), so a peer
  blocked on it waits for the whole collective timeout. `wake` shuts down the group's own TCP
  connections instead (those it opened in `init_process_group`, never the listener, never
  another socket): the blocked call raises "Connection closed by peer" at once, here and on the
  peers.
torch's `shrink_group` is not used: the world keeps its size (a replacement takes the lost rank's
place); it serves a job that goes on without the lost rank.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Collection

import torch.distributed as dist

from . import compat

log = logging.getLogger(__name__)

Sockets = frozenset[tuple[int, str]]  # (fd, "socket:[inode]"): a descriptor and what it was when recorded


def sockets() -> Sockets:
    """This process's open sockets now (read `after - before` around `init_process_group`)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed since the listing
            continue
        if link.startswith("socket:"):
            found.add((int(name), link))
    return frozenset(found)


def wake(pg: dist.ProcessGroup, backend: str, own: Collection[tuple[int, str]]) -> None:
    """From the watcher thread, while `pg` is still the current group: make a collective blocked
    on it return. `own`: the sockets the group opened (gloo)."""
    if backend == "nccl":
        # On its own thread: ProcessGroupNCCL's abort of a communicator still forming waited 60 s
        # (torch 2.11, an H200), and the caller holds the Job's lock.
        threading.Thread(target=_abort, args=(pg,), name="launcher-inplace-abort", daemon=True).start()
        return
    for fd, link in own:
        try:
            # gloo closes a pair's descriptor once the pair failed, and the number may be taken by
            # another socket since: act only on the very socket recorded.
            if os.readlink(f"/proc/self/fd/{fd}") != link:
                continue
            with socket.socket(fileno=os.dup(fd)) as s:  # a duplicate: closing it leaves gloo's descriptor
                if not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):  # gloo dies if its listener fails
                    s.shutdown(socket.SHUT_RDWR)
        except OSError:  # gone or not connected any more: nothing to wake there
            continue


def shut(own: Collection[tuple[int, str]]) -> None:
    """Shut down the sockets `own` (the store client's): a call blocked on them raises at once. A join
    waiting in the store for a rank that will not come (lost before it joined) wakes so."""
    for fd, link in own:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != link:  # closed, and the number reused since
                continue
            with socket.socket(fileno=os.dup(fd)) as s:  # a duplicate: closing it leaves the client's descriptor
                s.shutdown(socket.SHUT_RDWR)
        except OSError:  # gone or not connected any more
            continue


def leave(pg: dist.ProcessGroup | None, backend: str) -> None:
    """On the main thread, at a step boundary: abort (NCCL) and destroy the round's group."""
    if pg is None:
        return
    if backend == "nccl":
        _abort(pg)  # the collective returned: the communicators are aborted before they are destroyed
    # Should this raise, the worker ends with it and the agent falls back to restarting the group.
    dist.destroy_process_group()


def _abort(pg: dist.ProcessGroup) -> None:
    try:
        compat.abort_group(pg)  # idempotent: the watcher may have aborted it already
    except Exception:  # an abort that fails leaves the collective to its own timeout
        log.warning("aborting the NCCL process group failed", exc_info=True)
