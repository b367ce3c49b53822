"""DDP made again after a recovery, as it was: the same bucket layout, so the same sums.

DDP reduces its first iteration's gradients in one bucket in parameter order, then rebuilds its
buckets in the order the gradients became ready. A sum of the same numbers in another order rounds
differently (gloo's and NCCL's rings add each element's contributions in an order set by its offset
in the bucket), so a DDP made afresh after a recovery would sum its first step otherwise than the
undisturbed run and the weights would drift by the last bit. The new DDP starts from the layout the
old one had (a survivor's, sent to a replacement), and rebuilds to the same one after its first step.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import compat

Layout = list[list[int]]  # per bucket, in the reducer's order: indices into DDP's own parameter list


def make(module: torch.nn.Module, first: bool, layout: Layout | None, **kwargs: Any) -> DistributedDataParallel:
    """DDP(module): with rank 0's broadcast only where no rank held the state yet (`first`; torch < 2.5
    always broadcasts: every rank holds the same state then, so it changes nothing), and `layout`'s buckets."""
    with _assigned(layout):
        return DistributedDataParallel(module, **compat.ddp_kwargs(first), **kwargs)


def zeroed_layout(model: DistributedDataParallel) -> Layout:
    """The buckets a DDP reduces with now, read from the reducer's zeroed copies of them (for tests)."""
    index = {id(p): i for i, p in enumerate(model._module_parameters)}
    buckets = sorted(model.reducer._get_zeros_like_grad_buckets(), key=lambda b: b.index())
    return [[index[id(p)] for p in b.parameters()] for b in buckets]


class Recorder:
    """The order a DDP's gradients become ready in its first backward, and the buckets DDP rebuilds
    from it: read without touching the reducer (whose buckets torch shows only as fresh zeroed copies,
    a second set of gradients at the worst moment)."""

    def __init__(self, model: DistributedDataParallel):
        self.params: list[torch.Tensor] = list(getattr(model, "_module_parameters", None) or [])
        self.order: list[int] = []
        self.limits = _rebuild_limits(model)
        self._handles = [p.register_post_accumulate_grad_hook(self._ready(i)) for i, p in enumerate(self.params)]

    def _ready(self, index: int):
        def ready(_: torch.Tensor) -> None:
            self.order.append(index)
            if len(self.order) == len(self.params):
                for handle in self._handles:
                    handle.remove()

        return ready

    def layout(self) -> Layout | None:
        """The buckets DDP reduces with once it rebuilt them (None: not known yet, or not reproducible)."""
        if self.limits is None or not self.params or sorted(self.order) != list(range(len(self.params))):
            return None
        tensors = [self.params[i] for i in self.order]
        buckets, _ = dist._compute_bucket_assignment_by_size(tensors, self.limits, [False] * len(tensors), self.order)
        return [list(b) for b in buckets]


def _rebuild_limits(model: DistributedDataParallel) -> list[int] | None:
    """The bucket caps DDP's reducer rebuilds with (None: a rebuild this cannot reproduce)."""
    if os.environ.get("DDP_SET_LAST_BUCKET_CAP") == "1" or any(
        getattr(m, "sparse", False)
        for m in model.module.modules()
        if isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag)
    ):
        return None
    config = getattr(model, "_bucket_config", None)  # torch >= 2.12; before it, the reducer's defaults
    if config is not None and getattr(config, "has_custom_per_bucket_caps", False):
        return list(config.per_bucket_bytes_caps)
    if config is not None:
        first = config.first_bucket_bytes_cap
    elif getattr(model, "bucket_bytes_cap_default", True):  # torch < 2.12: a small first bucket by default
        first = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1 << 20)
    else:  # ... and none where bucket_cap_mb was given
        first = model.bucket_bytes_cap
    return [int(first), int(model.bucket_bytes_cap)]


@contextlib.contextmanager
def _assigned(layout: Layout | None) -> Iterator[None]:
    """While DDP is made, its first bucket assignment is `layout` (DDP hands the reducer it reversed)."""
    if not layout:
        yield
        return
    original = dist._compute_bucket_assignment_by_size

    def assign(tensors: list, limits: list, *args: Any, **kwargs: Any) -> tuple[Layout, list[int]]:
        if sorted(i for bucket in layout for i in bucket) != list(range(len(tensors))):
            return original(tensors, limits, *args, **kwargs)  # another model: its own layout
        return list(reversed(layout)), [max(limits)] * len(layout)

    dist._compute_bucket_assignment_by_size = assign
    try:
        yield
    finally:
        dist._compute_bucket_assignment_by_size = original


def refuse_sharded(where: str, obj: Any) -> None:
    """A replacement gets a survivor's whole state: state sharded across ranks cannot come back so."""
    name = type(obj).__name__
    sharded = name in ("FullyShardedDataParallel", "ZeroRedundancyOptimizer", "FSDPModule")
    if isinstance(obj, torch.nn.Module) and not sharded:
        sharded = any(type(p).__name__ == "DTensor" for p in obj.parameters())
        name = f"{name} with DTensor parameters (FSDP2, tensor parallel)" if sharded else name
    if sharded:
        raise SystemExit(
            f"launcher: {where}: {name} shards its state across ranks, and --recovery in-place rebuilds a lost "
            "rank from a replica of the whole state (DDP); use --recovery restart"
        )
