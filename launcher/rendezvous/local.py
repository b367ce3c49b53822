"""Rendezvous without a store: one node (`local`) or fixed ranks given on the command line (`static`).

Nothing is exchanged between nodes, so nothing can be lost: every round is decided here. The
worker with global rank 0 hosts the bootstrap store (TORCHELASTIC_USE_AGENT_STORE=False), so a
restart always meets a fresh store instead of the last attempt's keys (pytorch#135712).
"""

from __future__ import annotations

from typing import Callable

from ..config import LaunchConfig
from ..errors import RendezvousConnectionError, RestartBudgetExhausted
from ..net import free_port, port_taken
from ..spec import Round
from .api import Cause


class LocalRendezvous:
    """Rounds decided by this node alone; the restart budget is this node's."""

    def __init__(self, config: LaunchConfig, port_picker: Callable[[], int] = free_port):
        self.config = config
        self._pick_port = port_picker
        self._round = -1
        self._restarts = 0
        if config.rdzv_backend == "static" and config.node_rank == 0 and config.master_port:
            taken = port_taken(config.master_port)  # rank 0's store would die on it: say so before starting
            if taken:
                raise RendezvousConnectionError(
                    f"--master_port {config.master_port} is already in use on this host ({taken}); "
                    "stop what holds it or pick another --master_port")

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

