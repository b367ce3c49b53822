"""The descriptors of this process: every store server's connections against one cap (they share a
descriptor table), and raising the soft limit to the hard one."""

from __future__ import annotations

import logging
import resource
import threading

log = logging.getLogger(__name__)

RESERVE = 256  # descriptors left to the rest of the process (workers' pipes, log files, the other store)


class _Descriptors:
    """The servers of this process and their connections, against one cap (they share a descriptor table)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0  # connections, every server together
        self.cap = 0  # the most `open` may be: the soft limit less RESERVE
        self.expect = 0  # connections the servers' jobs said they need
        self.warned = False
        self.servers: list = []  # the StoreServers of this process

    def make_room(self, asking) -> None:
        """Ask another server holding connections that never validated to close its oldest."""
        with self.lock:
            others = [s for s in self.servers if s is not asking and s._greeting]
        if others:
            others[0]._evict_soon()


_FDS = _Descriptors()


def raise_descriptor_limit(expect: int = 0) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the process's connection cap, which leaves RESERVE.

    `expect`: connections one more store will serve. Says once per process (a warning) when the
    hard limit is below what its stores expect plus RESERVE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:  # a container's seccomp, or an odd hard limit: keep the soft one
            log.debug("cannot raise the descriptor limit from %d to %d: %s", soft, hard, e)
    cap = max(64, soft - RESERVE)
    with _FDS.lock:
        _FDS.cap = cap
        _FDS.expect += expect
        expect = _FDS.expect
        if expect + RESERVE > soft and not _FDS.warned:
            _FDS.warned = True
            log.warning(
                "the open-file limit is %d (hard %d): the store expects up to %d connections and the process "
                "needs ~%d more; past %d connections the store refuses new ones: raise it (ulimit -n %d, "
                "LimitNOFILE= for a service, --ulimit nofile= for a container)",
                soft,
                hard,
                expect,
                RESERVE,
                cap,
                expect + RESERVE,
            )
    return cap
