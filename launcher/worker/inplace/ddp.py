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
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

Layout = list[list[int]]  # per bucket, in the reducer's order: indices into DDP's own parameter list

SKIPS_SYNC = "init_sync" in inspect.signature(DistributedDataParallel.__init__).parameters  # torch >= 2.5


def make(module: torch.nn.Module, first: bool, layout: Layout | None, **kwargs: Any) -> DistributedDataParallel:
    """DDP(module): with rank 0's broadcast only where no rank held the state yet (`first`; torch < 2.5
    always broadcasts: every rank holds the same state then, so it changes nothing), and `layout`'s buckets."""
    if SKIPS_SYNC:
        kwargs["init_sync"] = first
    with _assigned(layout):
        return DistributedDataParallel(module, **kwargs)


def layout_of(model: Any) -> Layout | None:
    """The bucket layout a DDP reduces with now (None: not a DDP, or torch keeps it out of reach)."""
    reducer = getattr(model, "reducer", None)
    own = getattr(model, "_module_parameters", None)
    if not isinstance(model, DistributedDataParallel) or reducer is None or own is None:
        return None
    index = {id(p): i for i, p in enumerate(own)}
    try:
        # One zeroed copy of each bucket for a moment: the only way torch shows which tensors each holds.
        buckets = sorted(reducer._get_zeros_like_grad_buckets(), key=lambda b: b.index())
        return [[index[id(p)] for p in b.parameters()] for b in buckets]
    except (AttributeError, KeyError, RuntimeError):
        return None


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
