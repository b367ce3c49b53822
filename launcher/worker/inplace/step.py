"""A step and its commit point: where a lost peer makes the step run again, and where it no longer does.

A step changes the job's state at one point, its **commit**: the kept optimizers' step (a kept
GradScaler's `step` counts, even when it skips an update for an overflow), or `step.commit()`, or,
with neither, the end of `with step:`. A lost peer before the commit: the step runs again, from the
random streams and module buffers it began with (its dropout masks and batch-norm statistics are the
ones it drew the first time). After it: the step is done, whatever the rest of the block did not run
(a logged loss's all_reduce, say), and it is never applied twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from . import rng

log = logging.getLogger(__name__)


class Owner(Protocol):
    """What a step needs of its job (`Job`)."""

    rank: int

    def lost(self, error: BaseException) -> bool: ...
    def recover(self) -> Any: ...
    def committed(self, step: Step) -> None: ...
    def torn(self, step: Step) -> str: ...
    def leave(self, why: str) -> None: ...
    def inflight(self) -> Step | None: ...


class Step:
    """One training step: `with step:` turns a lost peer inside into a recovery (see the module)."""

    def __init__(self, job: Owner, index: int, batch: Any = None):
        self.job, self.index, self.batch = job, index, batch
        self.entered = self.done = self.committed = False
        self.drawn = False  # its backward began: its draws and buffer updates are made (job.py `_drawn`)
        self.stepped: set[int] = set()  # id() of the kept optimizers that stepped in it

    def __index__(self) -> int:
        return self.index

    def __int__(self) -> int:
        return self.index

    def __repr__(self) -> str:
        return f"Step({self.index})"

    def commit(self) -> None:
        """This step's changes to the kept state are made: a lost peer from here on does not run it again."""
        if not self.committed:
            self.committed = True
            self.job.committed(self)

    def __enter__(self) -> Step:
        self.entered = True
        return self

    def __exit__(self, kind, error, tb) -> bool:
        if error is None:
            self.commit()
            self.done = True
            return False
        if not self.job.lost(error):
            return False
        torn = self.job.torn(self)
        if torn:
            self.job.leave(f"a peer was lost in step {self.index} between {torn}: in place cannot make that exact")
        where = "after its commit point" if self.committed else "before its commit point"
        what = type(error).__name__
        log.info(f"rank {self.job.rank}: a peer was lost in step {self.index} {where} ({what}); recovering")
        self.job.recover()
        return True


class Commits:
    """Which kept optimizers stepped in the step in flight: the commit comes once all of them did."""

    def __init__(self, job: Owner):
        self.job = job
        self.optimizers: dict[int, str] = {}  # id() -> the name it was kept under

    def watch(self, name: str, obj: Any) -> None:
        """Hook a kept optimizer (its step commits) or GradScaler (its `step(optimizer)` does, skipped or not)."""
        if isinstance(obj, torch.optim.Optimizer):
            self.optimizers[id(obj)] = name
            obj.register_step_post_hook(lambda opt, args, kwargs: self._stepped(opt))
        elif callable(getattr(obj, "unscale_", None)) and callable(getattr(obj, "step", None)):  # a GradScaler
            original = obj.step

            def step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
                try:
                    return original(optimizer, *args, **kwargs)
                finally:
                    self._stepped(optimizer)  # skipped for an inf: the step is still this step's

            obj.step = step  # on this object only: the class and other scalers are untouched

    def _stepped(self, optimizer: Any) -> None:
        step = self.job.inflight()
        if step is None or id(optimizer) not in self.optimizers or step.committed:
            return
        step.stepped.add(id(optimizer))
        if step.stepped >= self.optimizers.keys():
            step.commit()

    def torn(self, step: Step) -> str:
        """The kept optimizers that had stepped when the step broke, if not all of them ("" if none or all)."""
        if step.committed or not step.stepped:
            return ""
        done = sorted(self.optimizers[i] for i in step.stepped)
        rest = sorted(n for i, n in self.optimizers.items() if i not in step.stepped)
        return f"the steps of {', '.join(done)} and of {', '.join(rest)}"


class Snapshot:
    """What a step done again must begin from that its first run changed before the commit: the random
    streams, and the buffers of the kept modules that change in a step (batch-norm statistics)."""

    def __init__(self) -> None:
        self.rng: rng.State | None = None
        self.buffers: list[tuple[torch.Tensor, torch.Tensor]] = []  # (buffer, its copy)
        self._versions: list[tuple[torch.Tensor, int]] = []
        self._moving: set[int] | None = None  # id() of the buffers seen to change (None: not learnt yet)

    def take(self, modules: list[torch.nn.Module]) -> None:
        """At the start of a step (the first time it runs)."""
        self.rng = rng.get()
        every = [b for m in modules for b in m.buffers()]
        self._learn(every)
        moving = every if self._moving is None else [b for b in every if id(b) in self._moving]
        self.buffers = [(b, b.detach().clone()) for b in moving]
        self._versions = [(b, b._version) for b in every]

    def moving(self, buffer: torch.Tensor) -> bool:
        """`buffer` changes in a step (before the first step is done: assumed to)."""
        return self._moving is None or id(buffer) in self._moving

    def now(self) -> tuple[rng.State, list[torch.Tensor]]:
        """The streams and the changing buffers as they are now (in a step that broke)."""
        return rng.get(), [buf.detach().clone() for buf, _ in self.buffers]

    def put(self, state: tuple[rng.State, list[torch.Tensor]]) -> None:
        """Back to what `now` returned."""
        streams, copies = state
        rng.put(streams)
        with torch.no_grad():
            for (buf, _), copy in zip(self.buffers, copies):
                buf.copy_(copy)

    def restore(self) -> None:
        """Back to the start of the step, to run it again."""
        if self.rng is not None:
            rng.put(self.rng)
        with torch.no_grad():
            for buf, copy in self.buffers:
                buf.copy_(copy)

    def watch(self, modules: list[torch.nn.Module]) -> None:
        """At each step's end, where no step runs again in place (a group restart's records): learn which
        buffers change in a step, as `take` does, copying them once (at the first step's end) only."""
        every = [b for m in modules for b in m.buffers()]
        if self._moving is None and not self.buffers:
            self.buffers = [(b, b.detach().clone()) for b in every]
        else:
            self._learn(every)
            self.buffers = []
        self._versions = [(b, b._version) for b in every]

    def _learn(self, every: list[torch.Tensor]) -> None:
        """After the first step, copy only the buffers that changed in it (or whose version moved since)."""
        if self._moving is None:
            if self.buffers:  # the first step's copies, all of them: which ones did it change?
                self._moving = {id(b) for b, copy in self.buffers if not torch.equal(b, copy)}
            return
        self._moving |= {id(b) for b, v in self._versions if b._version != v}


@dataclass(frozen=True)
class Recovery:
    """One recovery as this rank saw it."""

    round: int
    seconds: float  # from the call to `recover` (a newcomer: from its first step) to holding the state
    sent: int  # bytes of state this rank sent (the source), else 0
    received: bool  # this rank received the state (a newcomer, or a survivor that was behind)
    moving: float = 0.0  # seconds of `seconds` spent sending or receiving the state
    # (phase, wall-clock time) as this rank went: seen, left, joined, planned, moved, made (docs/in-place.md)
    marks: tuple[tuple[str, float], ...] = ()
