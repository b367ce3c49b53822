"""In-place recovery, the worker's side: the process group of each round, the state a newcomer
receives, and the step loop that turns a lost peer into one recovery at a step boundary."""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ...tcpstore.client import StoreClient, StoreError
from . import abort, keys, transfer

log = logging.getLogger(__name__)

WATCH_EVERY = 1.0  # seconds each wait of the watcher lasts before it looks at the round again


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


class Job:
    """This worker's part of a job that recovers in place (`--recovery in-place`; docs/in-place.md).

    Made once, first thing: it joins the round's process group (`backend`: nccl where CUDA is
    there, else gloo) on its own prefix of the launcher's store. Then `keep(...)` the state,
    `ddp(model)` (or `wrap(factory)`), and train in `for step in job.steps(n): with step: ...`.
    Without `--recovery in-place` it is a plain process group: a lost peer raises as usual.
    `job.joining` is True in a replacement, whose kept state a survivor overwrites: build big
    state with `torch.empty` there (the transfer faults its pages in, then fills them).
    """

    def __init__(
        self,
        backend: str | None = None,
        *,
        device: torch.device | None = None,
        timeout: float = 60.0,
        notice: float | None = None,
    ):
        env = os.environ
        self.rank, self.world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        local = int(env.get("LOCAL_RANK", "0"))
        self.device = device or (torch.device("cuda", local) if self.backend == "nccl" else torch.device("cpu"))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL binds each communicator to the current device
        agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        # Worker rank 0's own store dies with it: nothing would be left to meet in.
        self.in_place = env.get(keys.RECOVERY_VAR) == keys.IN_PLACE and agent_store
        # torchrun sets no LAUNCHER_ROUND: its restarts meet on their own prefix all the same
        self.round = int(env.get("LAUNCHER_ROUND", env.get("TORCHELASTIC_RESTART_COUNT", "0")))
        self.step = 0
        # How long a peer's error waits for the agent's word: the agent says (longer across nodes, where a
        # node lost whole is known only once the rendezvous store ends its session); 5 s without it.
        self.timeout, self.notice = timeout, notice if notice is not None else float(env.get(keys.NOTICE_VAR, "5"))
        self.model: Any = None  # what `ddp`/`wrap` made, made again after each recovery
        self.recoveries: list[Recovery] = []
        self._kept: dict[str, Any] = {}
        self._make: Callable[[bool], Any] | None = None
        self._holds_state = False  # False until this rank holds the job's state (a newcomer: once received)
        self._synced = False
        self._joined_at = 0.0  # wall-clock time this rank's newest group formed
        self._lost = threading.Event()  # the agent opened the next round
        self._moved = threading.Event()  # this rank joined a new round (the watcher looks further)
        self._lock = threading.Lock()
        self._pg: dist.ProcessGroup | None = None
        self._sockets: abort.Sockets = frozenset()  # those the current group opened (gloo's wake-up)
        self._addr, self._port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
        wait = datetime.timedelta(seconds=timeout)
        self.store = dist.TCPStore(
            self._addr, self._port, is_master=not agent_store and self.rank == 0, timeout=wait, wait_for_workers=False
        )
        self._join(self.round)
        # A replacement: its round was opened by an in-place recovery, so a survivor sends it the state.
        self.joining = self.in_place and self._received_round()
        if self.in_place:
            threading.Thread(target=self._watch, name="launcher-inplace-watch", daemon=True).start()

    # ------------------------------------------------------------------ what the script calls

    def keep(self, **state: Any) -> None:
        """Register what a newcomer receives from a survivor: objects with `state_dict()` and
        `load_state_dict()` (a model, an optimizer, a scheduler, a stateful sampler). The step
        and the RNG come with them."""
        for name, obj in state.items():
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(f"keep({name}=...): {type(obj).__name__} has no state_dict()/load_state_dict()")
        self._kept.update(state)

    def wrap(self, make: Callable[[bool], Any]) -> None:
        """How to make `job.model` (e.g. the DDP wrapper): `make(first)` is called once the state is
        in place, and again after each recovery; `first` is True in the job's first round only."""
        self._make = make

    def ddp(self, module: torch.nn.Module, **kwargs: Any) -> None:
        """`job.model` is DistributedDataParallel(module, **kwargs), made again after each recovery
        (without DDP's broadcast from rank 0 then: the state is in place already)."""
        from torch.nn.parallel import DistributedDataParallel

        from .compat import ddp_kwargs

        self.wrap(lambda first: DistributedDataParallel(module, **ddp_kwargs(first), **kwargs))

    def steps(self, total: int) -> Iterator[Step]:
        """The steps from `job.step` to `total`; after a recovery the step in flight comes again.
        `job.step` counts the steps done: it is `step.index + 1` once `with step:` ended well."""
        if not self._synced:
            self._sync(first=not self.joining)
        while self.step < total:
            if self._lost.is_set():  # a peer was lost between steps: recover before the next
                self.recover()
            step = Step(self, self.step)
            yield step
            if not step.entered:
                self.step += 1

    def recover(self) -> Recovery:
        """Leave the broken group, join the agent's newest round, and bring the state to whoever lacks it."""
        if not self.in_place:
            raise RuntimeError("in-place recovery needs `python -m launcher --recovery in-place`")
        began, marks = time.monotonic(), [("seen", time.time())]
        self.store.wait([keys.opened(self.round + 1)])
        newest = int(self.store.get(keys.NEWEST))
        with self._lock:
            pg, self._pg = self._pg, None
        self.model = None  # the old wrapper holds the old group
        abort.leave(pg, self.backend)
        marks.append(("left", time.time()))
        self._join(newest)
        marks.append(("joined", time.time()))
        self._lost.clear()
        return self._sync(first=False, began=began, marks=marks)

    def close(self) -> None:
        """Leave the process group (at the end of training)."""
        with self._lock:
            pg, self._pg = self._pg, None
        if pg is not None:
            dist.destroy_process_group()

    # ------------------------------------------------------------------ inside

    def lost(self, error: BaseException) -> bool:
        """Whether `error` comes from a peer the agent replaces (waits up to `notice` s for its word)."""
        if not self.in_place or isinstance(error, (KeyboardInterrupt, SystemExit)):
            return False
        return self._lost.wait(self.notice if isinstance(error, RuntimeError) else 0.0)

    def _join(self, rnd: int) -> None:
        prefixed = dist.PrefixStore(keys.group_prefix(rnd), self.store)
        wait = datetime.timedelta(seconds=self.timeout)
        before = abort.sockets()
        dist.init_process_group(self.backend, store=prefixed, rank=self.rank, world_size=self.world_size, timeout=wait)
        with self._lock:
            self._pg, self.round, self._sockets = dist.group.WORLD, rnd, abort.sockets() - before
        self._joined_at = time.time()
        self._moved.set()

    def _received_round(self) -> bool:
        """A newcomer: its round was opened by an in-place recovery (the agent set its key)."""
        return self.store.check([keys.opened(self.round)])

    def _sync(self, first: bool, began: float | None = None, marks: list[tuple[str, float]] | None = None) -> Recovery:
        """Agree on who holds the state, move it, make the model, and tell the agent this rank is in."""
        began = time.monotonic() if began is None else began
        marks = [("joined", self._joined_at)] if marks is None else marks
        plan = transfer.plan(self._holds_state and bool(self._kept), self.step, self.device)
        marks.append(("planned", time.time()))
        sent, received, moved = 0, False, time.monotonic()
        if plan.to and self.rank == plan.source:
            sent = transfer.send(self._kept, self.step, plan.to, self.device)
        elif self.rank in plan.to:
            self.step, received = transfer.receive(self._kept, plan.source, self.device), True
        moved = time.monotonic() - moved
        marks.append(("moved", time.time()))
        for obj in self._kept.values():
            if isinstance(obj, torch.nn.Module):
                obj.zero_grad(set_to_none=True)  # the step in flight left partial gradients
        if self._make is not None:
            self.model = self._make(first)
        self._holds_state, self._synced = True, True
        if self.in_place and self.store.add(keys.joined(self.round), 1) == self.world_size:
            self.store.set(keys.ready(self.round), b"1")
        marks.append(("made", time.time()))
        done = Recovery(self.round, time.monotonic() - began, sent, received, moved, tuple(marks))
        if not first:
            self.recoveries.append(done)
            rate = f", {sent / moved / 1e9:.2f} GB/s" if sent and moved > 0 else ""
            what = "received the state" if received else "kept"
            what = f"sent the state ({sent / 1e6:.1f} MB{rate})" if sent else what
            log.info(f"rank {self.rank}: in place in round {self.round} after {done.seconds:.3f} s; {what}")
        return done

    def _watch(self) -> None:
        """The wake-up: once the agent opens the next round, flag it and wake a blocked collective."""
        try:
            client = StoreClient(self._addr, self._port, timeout=max(10.0, 2 * WATCH_EVERY))
        except (OSError, StoreError):
            log.warning("in-place recovery: cannot watch the launcher's store", exc_info=True)
            return
        while True:
            rnd = self.round
            try:
                if not client.wait([keys.opened(rnd + 1)], timeout=WATCH_EVERY):
                    continue
            except (OSError, StoreError):  # the store closed: the job ended or the launcher restarts it
                log.debug("in-place watcher: the store went away", exc_info=True)
                return
            self._lost.set()
            with self._lock:  # the main thread destroys the group under this lock: never wake a destroyed one
                if self._pg is not None and self.round == rnd:
                    abort.wake(self._pg, self.backend, self._sockets)
            while self.round == rnd:
                self._moved.wait()
                self._moved.clear()


class Step:
    """One training step: `with step:` turns a lost peer inside into a recovery (the step comes again)."""

    def __init__(self, job: Job, index: int):
        self.job, self.index = job, index
        self.entered = self.done = False

    def __index__(self) -> int:
        return self.index

    def __int__(self) -> int:
        return self.index

    def __repr__(self) -> str:
        return f"Step({self.index})"

    def __enter__(self) -> Step:
        self.entered = True
        return self

    def __exit__(self, kind, error, tb) -> bool:
        if error is None:
            self.done, self.job.step = True, self.index + 1
            return False
        if not self.job.lost(error):
            return False
        log.info(f"rank {self.job.rank}: a peer was lost in step {self.index} ({type(error).__name__}); recovering")
        self.job.recover()
        return True
