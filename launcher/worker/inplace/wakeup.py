"""The watcher's thread, in each worker under in place: once the agent opens the next round (a peer was
lost), it flags the job and wakes the main thread wherever it blocks (a collective, a join on the store)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ...tcpstore.client import StoreClient, StoreError
from . import abort, keys, leaving

log = logging.getLogger(__name__)

WATCH_EVERY = 1.0  # seconds each wait of the watcher lasts before it looks at the round again


def watch(job: Any, client: StoreClient) -> None:
    """The wake-up: once the agent opens the next round, flag it and wake a blocked collective
    (or a join blocked on the store)."""
    while True:
        rnd = job.round
        try:
            if not client.wait([keys.opened(rnd + 1)], timeout=WATCH_EVERY):
                continue
        except (OSError, StoreError):  # the store closed: the job ended or the launcher restarts it
            log.debug("in-place watcher: the store went away", exc_info=True)
            return
        with job._lock:  # the main thread destroys the group under this lock: never wake a destroyed one
            if job.round != rnd:  # this rank went to a newer round by itself
                continue
            job._lost.set()
            if job._pg is not None:
                abort.wake(job._pg, job.backend, job._sockets)
            joining = job._settling
            if joining:  # a join waits on the store for a rank that will not come
                job._store_shut = True
                abort.shut(job._store_sockets)
        deadline = time.monotonic() + job.notice
        while job.round == rnd:
            if joining and job._settling and time.monotonic() >= deadline:
                # Past the store, gloo connects to each peer's address until its timeout, and a peer
                # lost since it published one refuses every try: nothing this thread can wake.
                stuck(job, rnd)
            job._moved.wait(max(0.1, deadline - time.monotonic()) if joining else None)
            job._moved.clear()


def stuck(job: Any, rnd: int) -> None:
    """The main thread cannot leave a join of round `rnd`: this process is replaced (it exits at once)."""
    job._leaving = True
    leaving.say(
        job.rank,
        f"its join of round {rnd} waits on a rank lost since (a peer refusing every connection); starting "
        "again in the next round",
    )
    os._exit(keys.REJOIN_EXIT)
