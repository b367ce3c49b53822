"""What in-place recovery needs of torch that older releases (from 2.4, `setup.cfg`) lack, one shim each.

Each shim asks torch what it has (a signature, an attribute), never its version string: a backport
or a nightly says nothing by its number. What 2.4.1 was checked for and has as it is, with no shim:
`dist.PrefixStore`, `dist.TCPStore(wait_for_workers=)`, `init_process_group(store=, timeout=)` after
a `destroy_process_group()` in the same process, `send_object_list`/`recv_object_list`,
`torch.get_rng_state`, `Optimizer.register_step_post_hook`, `torch.amp.GradScaler`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.distributed as dist


@functools.cache
def _ddp_takes_init_sync() -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return "init_sync" in inspect.signature(DistributedDataParallel.__init__).parameters


def ddp_kwargs(first: bool) -> dict[str, Any]:
    """DistributedDataParallel's keyword that skips its start-up broadcast from rank 0 after a recovery:
    {"init_sync": first} where DDP takes it; {} where it does not (2.4), and DDP then broadcasts rank 0's
    parameters and buffers at each recovery: the same values every rank holds by then, one collective more."""
    return {"init_sync": first} if _ddp_takes_init_sync() else {}


def abort_group(pg: dist.ProcessGroup) -> None:
    """Abort every communicator of `pg` now (NCCL; from any thread): a collective blocked on it returns
    with an error. `ProcessGroup.abort()` where torch has it; on 2.4, which has none, the NCCL backend's
    `_shutdown()`, which there aborts the communicators (later releases turned shutdown into a drain)."""
    if hasattr(pg, "abort"):
        pg.abort()
        return
    backend = pg._get_backend(torch.device("cuda"))
    backend._shutdown()
