"""Rendezvous without a store: one node (`local`) or fixed ranks given on the command line (`static`).

Nothing is exchanged between nodes, so nothing can be lost: every round is decided here. The
worker with global rank 0 hosts the bootstrap store (TORCHELASTIC_USE_AGENT_STORE=False), so a
restart always meets a fresh store instead of the last attempt's keys (pytorch#135712).
"""

from __future__ import annotations

from typing import Callable

from ..config import LaunchConfig
from ..errors import RestartBudgetExhausted
from ..process import free_port
from ..spec import Round
from .api import Cause


class LocalRendezvous:
    """Rounds decided by this node alone; the restart budget is this node's."""

    def __init__(self, config: LaunchConfig, port_picker: Callable[[], int] = free_port):
        self.config = config
        self._pick_port = port_picker
        self._round = -1
        self._restarts = 0

    def next_round(self, cause: Cause) -> Round:
        c = self.config
        if cause is Cause.FAILURE:
            if self._restarts >= c.max_restarts:
                raise RestartBudgetExhausted(f"no restarts left (--max_restarts {c.max_restarts})")
            self._restarts += 1
        self._round += 1
        if c.rdzv_backend == "static":
            addr, port = c.master_addr, c.master_port  # every node must agree without talking
        else:
            addr, port = c.local_addr or "127.0.0.1", self._pick_port()
        assert port is not None
        return Round(
            run_id=c.run_id,
            round=self._round,
            restart_count=self._restarts,
            group_rank=c.node_rank,
            group_world_size=c.max_nodes,
            rank_offset=c.node_rank * c.nproc_per_node,
            world_size=c.max_nodes * c.nproc_per_node,
            master_addr=addr,
            master_port=port,
        )

    def watch(self, rnd: Round, post: Callable[[object], None]) -> None:
        """Nothing to watch: no other node can change this round."""

    def shutdown(self, succeeded: bool) -> None:
        """Nothing to leave."""
