"""The workers' bootstrap store (MASTER_ADDR:MASTER_PORT), served by the agent of group rank 0.

torchrun's contract: TORCHELASTIC_USE_AGENT_STORE=True and every worker is a TCPStore client, so
code that connects with `is_server=False` on every rank works unchanged. Unlike torchrun, the
server is fresh every round (a restart never reads the last attempt's keys, pytorch#135712). It is
the launcher's pure-Python `StoreServer` (no torch in the agent): 1,024 ranks bootstrap through it
in 0.4 s with 0.1 s of CPU (scripts/bench/bootstrap_store.py). `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`,
torchrun's own switch, makes worker rank 0 host it instead (torch's C++ server; for big gloo jobs,
whose full-mesh start-up is N² store reads).
"""

from __future__ import annotations

import dataclasses
import errno
import socket

from ..spec import Round
from ..tcpstore.server import StoreServer

DISABLE_VAR = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


class BootstrapStore:
    """One round's store at a time; `open()` closes the last round's first."""

    def __init__(self, environ: dict[str, str]):
        self.enabled = environ.get(DISABLE_VAR, "0") != "1"
        self.server: StoreServer | None = None

    def open(self, rnd: Round) -> tuple[Round, str]:
        """The round as the workers should see it, and a problem to report ("" if none).

        Group rank 0 serves a fresh store on MASTER_PORT; if it cannot, its worker rank 0 hosts
        one as before (False there; the other nodes' workers are clients either way). A server still open
        on the round's port was kept for it (a round asked for in place, whose workers restart in it: the
        other nodes' workers are in it already; each round meets on its own prefix): it stays."""
        if self.server is not None and rnd.group_rank == 0 and self.server.port == rnd.master_port:
            return dataclasses.replace(rnd, use_agent_store=True), ""
        self.close()
        if not self.enabled:
            return rnd, ""
        if rnd.group_rank == 0:
            try:
                self.server = _serve(rnd.master_addr, rnd.master_port, rnd.world_size)
            except OSError as e:
                return rnd, (
                    f"cannot serve the bootstrap store on {rnd.master_addr}:{rnd.master_port} "
                    f"({e.strerror or e}); worker rank 0 hosts it this round"
                )
        return dataclasses.replace(rnd, use_agent_store=True), ""

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def _serve(addr: str, port: int, world_size: int) -> StoreServer:
    """Bind MASTER_ADDR itself where it is an address of this host, else every address (as torch's
    server); every worker of the job connects (the server raises the descriptor limit for them)."""
    try:
        return StoreServer(addr, port, expect=world_size)
    except OSError as e:
        if e.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) and not isinstance(e, socket.gaierror):
            raise
    return StoreServer("::" if ":" in addr else "0.0.0.0", port, expect=world_size)
