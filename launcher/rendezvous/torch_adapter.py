"""Third-party rendezvous backends: a torch `RendezvousHandler` from the `torchrun.handlers` entry point
drives the supervisor through this adapter (`--rdzv_backend NAME`, torch imported only then).

The entry point names a function that returns a creator, `creator(RendezvousParameters) -> handler`,
as torch's registry calls it. Each round: `handler.next_rendezvous()` gives this node's group rank,
the group's size and a store; over that store (fresh per round in torch's dynamic handlers, as torch's
own rank assignment assumes) the nodes agree on the global rank offsets (one key per node, one
multi_get; none with `TORCH_ELASTIC_WORKER_IDENTICAL=1`, as in torch) and group rank 0 publishes the
address of the round's bootstrap store, which the supervisor serves fresh as for every backend. While
the round runs, a thread asks `num_nodes_waiting()` and `is_closed()` once a second, as torch's agent
does at each monitor turn; a waiting node re-forms the job.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .. import net, plugins
from ..errors import RendezvousClosedError, RendezvousError, RestartBudgetExhausted
from ..spec import Round, Verdict
from .api import Cause, JobParams, MembershipChanged, WaitReport

GROUP = "torchrun.handlers"
IDENTICAL_VAR = "TORCH_ELASTIC_WORKER_IDENTICAL"
WATCH_PERIOD = 1.0  # seconds between num_nodes_waiting() calls
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TorchHandlerSettings:
    """`--rdzv_backend NAME` found on the torchrun.handlers entry point, with what torchrun passes it."""

    name: str
    endpoint: str
    conf: tuple[tuple[str, str], ...] = ()  # --rdzv_conf, as strings (torch's RendezvousParameters.config)
    local_addr: str | None = None
    identical: bool = False  # TORCH_ELASTIC_WORKER_IDENTICAL=1: every node runs the same number of workers


class TorchHandlerRendezvous:
    """Our `RendezvousHandler` over a torch one; the restart budget is this node's, as in torchrun."""

    def __init__(self, settings: TorchHandlerSettings, job: JobParams):
        self.settings, self.job = settings, job
        try:
            from torch.distributed.elastic.rendezvous import RendezvousParameters

            creator = plugins.load(GROUP, settings.name)()
            params = RendezvousParameters(
                backend=settings.name,
                endpoint=settings.endpoint,
                run_id=job.run_id,
                min_nodes=job.min_nodes,
                max_nodes=job.max_nodes,
                local_addr=settings.local_addr,
                **dict(settings.conf),
            )
            self.handler = creator(params)
            made = self.handler.get_backend()
        except Exception as e:  # the plugin's own error, in one line
            raise RendezvousError(f"--rdzv_backend {settings.name}: {type(e).__name__}: {e}") from e
        if made != settings.name:  # as torch's registry checks it
            raise RendezvousError(
                f"--rdzv_backend {settings.name}: the torchrun.handlers plugin made a {made!r} handler "
                "(torchrun refuses it too); the plugin's get_backend() must return its entry point's name"
            )
        self._restarts = 0
        self._round = -1
        self._stop = threading.Event()

    def next_round(
        self, cause: Cause, verdict: Verdict | None = None, waiting: Callable[[WaitReport], None] | None = None
    ) -> Round:
        self._stop.set()  # the last round's watcher
        if cause is Cause.FAILURE:
            if self._restarts >= self.job.max_restarts:
                raise RestartBudgetExhausted(f"no restarts left (--max_restarts {self.job.max_restarts})")
            self._restarts += 1
        if waiting:
            waiting(WaitReport(f"waiting for the {self.settings.name} rendezvous (a torchrun.handlers backend)"))
        try:
            info = self.handler.next_rendezvous()
            rank, size, store = info.rank, info.world_size, info.store
            offset, world = self._ranks(store, rank, size)
            addr, port = self._master(store, rank)
            run_id = self.handler.get_run_id()
        except RendezvousError:
            raise
        except Exception as e:
            raise _ours(self.settings.name, e) from e
        self._round += 1
        return Round(
            run_id=run_id,
            round=self._round,
            restart_count=self._restarts,
            group_rank=rank,
            group_world_size=size,
            rank_offset=offset,
            world_size=world,
            master_addr=addr,
            master_port=port,
        )

    def _ranks(self, store, rank: int, size: int) -> tuple[int, int]:
        """This node's first global rank and the job's world size (torch: _assign_worker_ranks)."""
        nproc = self.job.nproc_per_node
        if self.settings.identical:
            return rank * nproc, size * nproc
        store.set(f"launcher/nproc/{rank}", str(nproc))
        counts = [int(v) for v in store.multi_get([f"launcher/nproc/{r}" for r in range(size)])]
        return sum(counts[:rank]), sum(counts)

    def _master(self, store, rank: int) -> tuple[str, int]:
        """MASTER_ADDR:MASTER_PORT: group rank 0's address and a free port there, published on the store."""
        if rank == 0:
            addr = self.settings.local_addr or socket.getfqdn()
            store.set("launcher/master", f"{addr} {net.free_port()}")
        addr, port = store.get("launcher/master").decode().rsplit(" ", 1)
        return addr, int(port)

    def watch(self, rnd: Round, post: Callable[[object], None]) -> None:
        self._stop = stop = threading.Event()

        def watching() -> None:
            while not stop.wait(WATCH_PERIOD):
                try:
                    if self.handler.is_closed():
                        post(MembershipChanged("the rendezvous was closed", closed=True))
                        return
                    waiting = self.handler.num_nodes_waiting()
                except Exception as e:  # the next round says what is wrong; say it now, once, too
                    log.warning(f"the {self.settings.name} rendezvous does not answer: {type(e).__name__}: {e}")
                    return
                if waiting > 0:
                    post(MembershipChanged(f"{waiting} node(s) waiting to join"))
                    return

        threading.Thread(target=watching, name="launcher-torch-rdzv-watch", daemon=True).start()

    def shared_store(self) -> None:
        """None: the handler's store is torch's (a different interface), so no job board on it."""
        return None

    def shutdown(self, succeeded: bool, why: str = "") -> None:
        """As torchrun's agent: close the rendezvous when this node gives up, then shut the handler down."""
        self._stop.set()
        try:
            if not succeeded:
                self.handler.set_closed()
            self.handler.shutdown()
        except Exception as e:
            log.warning(f"the {self.settings.name} rendezvous did not shut down cleanly: {type(e).__name__}: {e}")


def _ours(name: str, e: Exception) -> RendezvousError:
    """torch's rendezvous errors as ours (a closed rendezvous stays a closed one)."""
    text = f"the {name} rendezvous failed: {type(e).__name__}: {e}"
    return RendezvousClosedError(text) if type(e).__name__ == "RendezvousClosedError" else RendezvousError(text)
