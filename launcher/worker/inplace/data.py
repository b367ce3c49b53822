"""A loader resumed at a batch: what `Job.steps(loader)` iterates, so that a replacement continues the
epoch in flight at the exact sample and every sample of an epoch is used once across a recovery.

- A loader with `state_dict()`/`load_state_dict()` (torchdata's StatefulDataLoader) resumes from the
  state it had before the batch the job resumes at.
- A `DataLoader` over a map-style dataset resumes by skipping that many batches of *indices* (its
  sampler's order, e.g. a DistributedSampler after `set_epoch`): no sample is loaded to be thrown away.
- Anything else iterable is read and dropped up to that batch (said once: it costs a pass over them).
"""

from __future__ import annotations

import inspect
import itertools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

log = logging.getLogger(__name__)


def stateful(loader: Any) -> bool:
    """The loader keeps its own position (torchdata's StatefulDataLoader)."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def resume(loader: Iterable, skip: int, state: dict | None = None) -> Iterator:
    """An iterator over `loader` from its batch `skip` of this pass (`state`: a stateful loader's, for it)."""
    if stateful(loader):
        if state is not None:
            loader.load_state_dict(state)
        return iter(loader)
    if skip <= 0:
        return iter(loader)
    if isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
        return iter(_skipping(loader, skip))
    log.info(f"in-place recovery: reading and dropping {skip} batches to resume the loader (it has no sampler)")
    return itertools.islice(iter(loader), skip, None)


class _Skip:
    """A sampler (of indices or of batches of them) without its first `skip` items."""

    def __init__(self, inner: Any, skip: int):
        self.inner, self.skip = inner, skip

    def __iter__(self) -> Iterator:
        return itertools.islice(iter(self.inner), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.skip)


def _skipping(loader: DataLoader, skip: int) -> DataLoader:
    """`loader` once more, its sampler's first `skip` batches left out (the same workers, collate, pinning)."""
    accepted = inspect.signature(DataLoader.__init__).parameters  # they vary with torch's version
    kwargs = {
        name: getattr(loader, name)
        for name in (
            "num_workers",
            "collate_fn",
            "pin_memory",
            "timeout",
            "worker_init_fn",
            "multiprocessing_context",
            "generator",
            "persistent_workers",
            "pin_memory_device",
            "in_order",
        )
        if name in accepted and hasattr(loader, name)
    }
    if loader.num_workers > 0 and "prefetch_factor" in accepted:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if loader.batch_sampler is not None:
        return DataLoader(loader.dataset, batch_sampler=_Skip(loader.batch_sampler, skip), **kwargs)
    return DataLoader(loader.dataset, batch_size=None, sampler=_Skip(loader.sampler, skip), **kwargs)
