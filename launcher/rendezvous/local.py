"""Rendezvous without a store: one node (`local`) or fixed ranks given on the command line (`static`).

Nothing is exchanged between nodes, so nothing can be lost: every round is decided here. The
agent of group rank 0 serves a fresh bootstrap store every round (`bootstrap.py`), so a restart
never meets the last attempt's keys (pytorch#135712).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import RendezvousConnectionError, RestartBudgetExhausted
from ..net import free_port, port_taken
from ..spec import Round, Verdict
from .api import Cause, JobParams, WaitReport, budget_spent
from .settings import LocalSettings, StaticSettings

log = logging.getLogger(__name__)


class LocalRendezvous:
    """Rounds decided by this node alone; the restart budget is this node's."""

    def __init__(
        self, settings: LocalSettings | StaticSettings, job: JobParams, port_picker: Callable[[], int] = free_port
    ):
        self.settings = settings
        self.job = job
        self._pick_port = port_picker
        self._round = -1
        self._restarts = 0
        self._rank = settings.node_rank if isinstance(settings, StaticSettings) else 0
        if isinstance(settings, StaticSettings) and settings.node_rank == 0 and settings.master_port:
            taken = port_taken(settings.master_port)  # rank 0's store would die on it: say so before starting
            if taken:
                raise RendezvousConnectionError(
                    f"--master_port {settings.master_port} is already in use on this host ({taken}); "
                    "stop what holds it or pick another --master_port"
                )

    def next_round(
        self, cause: Cause, verdict: Verdict | None = None, waiting: Callable[[WaitReport], None] | None = None
    ) -> Round:
        s, job = self.settings, self.job
        if cause is Cause.FAILURE:
            if budget_spent(self._restarts + 1, job.max_restarts):
                raise RestartBudgetExhausted(f"no restarts left (--max_restarts {job.max_restarts})")
            self._restarts += 1
        self._round += 1
        if isinstance(s, StaticSettings):
            addr, port = s.master_addr, s.master_port  # every node must agree without talking
        else:
            addr, port = s.addr, self._pick_port()
        return Round(
            run_id=job.run_id,
            round=self._round,
            restart_count=self._restarts,
            group_rank=self._rank,
            group_world_size=job.max_nodes,
            rank_offset=self._rank * job.nproc_per_node,
            world_size=job.max_nodes * job.nproc_per_node,
            master_addr=addr,
            master_port=port,
        )

    def watch(self, rnd: Round, post: Callable[[object], None]) -> None:
        """No other node can change this round: nothing to watch."""

    def shared_store(self) -> None:
        """No store: nothing is shared."""
        return None

    def shutdown(self, succeeded: bool, why: str = "") -> None:
        """Nothing to leave."""

    def close(self, verdict: Verdict | None, reason: str) -> None:
        """Nothing shared to close: each node of a static job decides alone."""
