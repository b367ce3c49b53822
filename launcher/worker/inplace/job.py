"""In-place recovery, the worker's side: the process group of each round, the state a newcomer
receives, and the step loop that turns a lost peer into one recovery at a step boundary, exactly:
a step is applied once (its commit point: step.py), a loader resumes at the batch in flight
(data.py), each rank's random streams go on where they were (slots.py), and the job's end is one
point every rank reaches (`close`)."""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from ...tcpstore.client import StoreClient, StoreError
from .. import progress
from . import abort, data, ddp, keys, leaving, memory, rng, slots, transfer, wakeup
from .slots import Slot
from .step import Commits, Recovery, Snapshot, Step

log = logging.getLogger(__name__)


class Job:
    """This worker's part of a job that recovers in place (`--recovery in-place`; docs/in-place.md).

    Made once, first thing: it joins the round's process group (`backend`: nccl where CUDA is
    there, else gloo) on its own prefix of the launcher's store. Then `keep(...)` the state,
    `ddp(model)` (or `wrap(factory)`), and train in `for step in job.steps(n): with step: ...`
    (or `job.steps(loader)`, inside `for epoch in job.epochs(...)`), and `close()` at the end.
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
        self.step = 0  # steps done (committed)
        self._committed_here = 0  # steps committed in this process
        self.epoch: int | None = None  # the epoch in flight, under `epochs()`
        # How long a peer's error waits for the agent's word: the agent says (longer across nodes, where a
        # node lost whole is known only once the rendezvous store ends its session); 5 s without it.
        self.timeout, self.notice = timeout, notice if notice is not None else float(env.get(keys.NOTICE_VAR, "5"))
        self.model: Any = None  # what `ddp`/`wrap` made, made again after each recovery
        self.recoveries: list[Recovery] = []
        self._kept: dict[str, Any] = {}
        self._make: Callable[[bool], Any] | None = None
        self._holds_state = False  # False until this rank holds the job's state (a newcomer: once received)
        self._synced = self._leaving = self._closed = self._settling = self._store_shut = False
        self._joined_at = 0.0  # wall-clock time this rank's newest group formed
        self._lost = threading.Event()  # the agent opened the next round
        self._moved = threading.Event()  # this rank joined a new round (the watcher looks further)
        self._lock = threading.Lock()
        self._pg: dist.ProcessGroup | None = None
        self._sockets: abort.Sockets = frozenset()  # those the current group opened (gloo's wake-up)
        self._store_sockets: abort.Sockets = frozenset()  # the store client's (a join blocked on it wakes)
        self._inflight: Step | None = None
        self._commits, self._snapshot = Commits(self), Snapshot()
        self._last_epoch: int | None = None  # the newest epoch done, under `epochs()`
        self._batch = 0  # the batches of the loader's pass in flight done
        self._pass_rng: tuple[int, rng.State] | None = None  # (step the pass began at, streams before its iterator)
        self._loader_state: dict | None = None  # a stateful loader's, before the batch in flight
        self._sampler_epoch: int | None = None  # the pass's sampler's epoch (a DistributedSampler's `set_epoch`)
        self._loader: Any = None  # the stateful loader of the pass in flight
        self._in_pass = False  # inside `steps(loader)`: a commit moves the pass on a batch
        self._received: dict | None = None  # the sender's record, for the loader pass it resumes
        self._pending: tuple[str, int, rng.State] | None = None  # streams to take up at step N's start
        self._layout: list[list[int]] | None = None  # the DDP's buckets, to make it again as it was (ddp.py)
        self._recorder: Any = None  # ddp.Recorder: learns them in the first DDP's first backward
        self._buffers: dict[str, torch.Tensor] | None = None  # this rank's own, to take up after the sync
        self._early: tuple[int, transfer.Plan] | None = None  # (round, plan) agreed by `resumes()`
        self._addr, self._port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
        # What `keep` holds, copied to the agent's memory at each step's end: any restart resumes there (memory.py).
        self._memory, self._held = memory.Memory.open(env, self.rank, self.world_size, self._lost), []
        self._tracks = self.in_place or self._memory is not None  # the loader's position and streams are kept
        # This rank's own streams and buffers at each step, in the store: a node lost whole takes them with
        # it from its memory, and its ranks' successors go on exactly from another node's copy (memory.py).
        across = int(env.get("LOCAL_WORLD_SIZE", self.world_size)) < self.world_size
        self._records = self.in_place or (self._memory is not None and across)
        # The watcher's and the mirror's own connections, made before any socket is told apart as a
        # group's or the store client's (`abort.sockets()` before and after): a connection a thread
        # opened meanwhile would be taken for one of theirs, and shut down with them at a recovery.
        self._watcher = self._client(10.0) if self.in_place else None
        self._mirror_client = self._client(30.0) if self._records else None
        self.store = self._connect(is_master=not agent_store and self.rank == 0)
        # This rank's own streams and buffers, where its replacement finds them: the agent's folder in memory,
        # and a copy in the store for a replacement on another node.
        mirror = slots.Mirror(self._mirror_client, keys.slot(self.rank)).send if self._mirror_client else None
        self._slot = Slot(env.get(keys.SLOTS_VAR) if self.in_place else None, self.rank, mirror)
        self._record: dict[str, Any] = {}
        self._own = self._slot.read() if self.in_place else None  # a replacement: what its predecessor wrote
        if self.in_place:
            self._own_steps()  # else the store's copy of it: its node was lost whole
            leaving.install(self)  # a lost peer outside `with step:`: one line (leaving.py)
        if self._watcher is not None:
            threading.Thread(
                target=wakeup.watch, args=(self, self._watcher), name="launcher-inplace-watch", daemon=True
            ).start()
        first = self.round
        if self.in_place and self.store.check([keys.NEWEST]):  # started late: its round was replaced already
            first = max(first, int(self.store.get(keys.NEWEST)))
        self._enter(first, sync=False)
        # A replacement: its round was opened by an in-place recovery, and some rank holds the job's state.
        self.joining = self.in_place and self.store.check([keys.opened(self.round), keys.HELD])

    # ------------------------------------------------------------------ what the script calls

    def keep(self, **state: Any) -> None:
        """Register what a newcomer receives from a survivor: objects with `state_dict()` and
        `load_state_dict()` (a model, an optimizer, a GradScaler, a scheduler). The step, the
        loader's position and the random streams come with them. A kept optimizer's step is the
        step's commit point (step.py)."""
        for name, obj in state.items():
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(f"keep({name}=...): {type(obj).__name__} has no state_dict()/load_state_dict()")
            ddp.refuse_sharded(f"keep({name}=...)", obj)
            self._commits.watch(name, obj)
            trained = [p for p in obj.parameters() if p.requires_grad] if isinstance(obj, torch.nn.Module) else []
            for param in trained[-1:] if self.in_place else []:  # its gradient: about a backward's first (not frozen)
                param.register_post_accumulate_grad_hook(lambda _: self._drawn())
        self._kept.update(state)

    def wrap(self, make: Callable[[bool], Any]) -> None:
        """How to make `job.model` (e.g. the DDP wrapper): `make(first)` is called once the state is
        in place, and again after each recovery; `first` is True where no rank held the state yet."""
        self._make = make

    def ddp(self, module: torch.nn.Module, **kwargs: Any) -> None:
        """`job.model` is DistributedDataParallel(module, **kwargs), made again after each recovery
        (without DDP's broadcast from rank 0 then, where torch can skip it: the state is in place)."""

        def make(first: bool) -> Any:
            model = ddp.make(module, first, self._layout, **kwargs)
            if self._layout is None and self._tracks:
                self._recorder = ddp.Recorder(model)  # its rebuilt buckets, for the DDP made after a recovery
            return model

        self.wrap(make)

    def epochs(self, epochs: Iterable[int]) -> Iterator[int]:
        """The epochs of `epochs` not done yet: a replacement resumes at the one in flight."""
        self._sync_once()
        for epoch in epochs:
            done = self._last_epoch is not None and epoch <= self._last_epoch
            if done or (self.epoch is not None and epoch < self.epoch):
                continue
            self.epoch = epoch
            if self._batch == 0:  # a fresh epoch: the streams it begins with, before the script's own code
                self._take_pending(self.step, fresh=True)
            yield epoch
            self.epoch, self._last_epoch, self._batch = None, epoch, 0

    def steps(self, what: int | Iterable) -> Iterator[Step]:
        """The steps from `job.step` to `what` (a count), or one per batch of `what` (a loader: the
        batch is `step.batch`; a replacement resumes at the batch in flight). After a recovery the step
        in flight comes again unless it was committed. `job.step` counts the steps committed."""
        self._sync_once()
        if isinstance(what, int):
            while self.step < what:
                if self._lost.is_set():  # a peer was lost between steps: recover before the next
                    self.recover()
                    continue
                yield from self._attempts(Step(self, self.step))
        else:
            yield from self._pass(what)
        if self._memory is not None:  # what follows the loop (an eval, the end) finds its last step in memory
            self._memory.wait()

    def resumes(self) -> bool:
        """Whether the group resumes from the launcher's copies in memory (docs/memory.md): they replace a
        checkpoint the script would load (newer, taken at every step), so it can skip its own load. Call
        it on every rank at the same point, after `keep` (it agrees with the others over the group)."""
        if self.joining or self._holds_state or self._memory is None or not self._kept:
            return False  # a replacement in place receives the state; nothing kept: nothing copied
        if self._early is None or self._early[0] != self.round:
            copies = memory.steps(self)
            self._early = (self.round, transfer.plan(False, self.step, self.device, copies))
        return self._early[1].memory >= 0

    def recover(self) -> Recovery:
        """Leave the broken group, join the agent's newest round, and bring the state to whoever lacks it."""
        if not self.in_place:
            raise RuntimeError("in-place recovery needs `python -m launcher --recovery in-place`")
        began, marks = time.monotonic(), [("seen", time.time())]
        with self._lock:
            pg, self._pg = self._pg, None
        self._layout = self._layout_now()
        self.model = None  # the old wrapper holds the old group
        abort.leave(pg, self.backend)
        marks.append(("left", time.time()))
        step, drawn = self._inflight, None
        if step is not None and not step.committed:
            drawn = self._snapshot.now()  # this rank's own draws and buffers of the step, should it stand
            self._snapshot.restore()  # the step runs again from where it began
        done = self._enter(self._next_round(self.round), sync=True, began=began, marks=marks)
        if drawn is not None and step is not None and self.step > step.index:
            # Others committed the step (an all-reduce that completed on some ranks only) and sent their
            # state: the step stands, and what this rank drew and updated in it is its own, not theirs.
            self._pending = None
            self._snapshot.put(drawn)
            self._keep_record()  # as at a commit of its own
        return done

    def close(self) -> None:
        """The job's end: in place, every rank waits here for the others (a rank lost before it is
        recovered; once all are here, a loss costs nothing). Then leave the process group."""
        if self._closed:
            return
        self._closed = True
        if self.in_place and not self._leaving:
            self._finish()
        with self._lock:
            pg, self._pg = self._pg, None
        if pg is not None:
            dist.destroy_process_group()

    # ------------------------------------------------------------------ the loop

    def fails(self, error: BaseException) -> bool:
        """`error` ends this rank (its excepthook): nothing waits at the job's end. True where, in place, a
        lost peer raised it (the rank leaves in one line); False for any other, or once this rank leaves."""
        first, self._leaving = not self._leaving, True
        if not (first and self.in_place and isinstance(error, Exception)):
            return False
        return self._lost.is_set() or (leaving.from_peer(error) and self.lost(error))

    def lost(self, error: BaseException) -> bool:
        """Whether `error` comes from a peer the agent replaces (waits up to `notice` s for its word)."""
        if not self.in_place or isinstance(error, (KeyboardInterrupt, SystemExit)):
            return False
        return self._lost.wait(self.notice if isinstance(error, RuntimeError) else 0.0)

    def _attempts(self, step: Step) -> Iterator[Step]:
        """Yield `step` until it is done: again after a recovery that left it uncommitted."""
        if self.in_place:
            # A replacement's own streams first: the step's start, should it run again, is where they are.
            self._take_pending(step.index, fresh=False)
            self._snapshot.take([m for m in self._kept.values() if isinstance(m, torch.nn.Module)])
            self._record["start"] = (step.index, self._snapshot.rng)
            self._slot.write(self._record)
        while True:
            self._take_pending(step.index, fresh=False)
            self._inflight = step
            yield step
            self._inflight = None
            if not step.entered:  # the script did not use `with step:`: done as it is
                step.commit()
            if self.step > step.index:  # committed, here or by the rank this one received from
                if self._memory is not None:  # the step's state, whole: where a restart of the group resumes
                    self._memory.save(self._kept, self._meta(), self.round, self.model)
                return
            step.entered = step.committed = step.drawn = False
            step.stepped.clear()

    def _pass(self, loader: Iterable) -> Iterator[Step]:
        """One pass over `loader`, a step per batch, from the batch in flight."""
        sampler = getattr(loader, "sampler", None)
        self._sampler_epoch = getattr(sampler, "epoch", None)
        began = self.step - self._batch
        got, self._received = self._received, None
        if got is not None and self._batch:
            if got["sampler_epoch"] != self._sampler_epoch:
                self.leave(
                    f"the loader resumes at epoch {self._sampler_epoch} of its sampler, the job's is at "
                    f"{got['sampler_epoch']}: put `job.steps(loader)` inside `for epoch in job.epochs(...)`"
                )
            own = (self._own or {}).get("pass")
            start = own if own and own[0] == began else got["pass_rng"]
            if start is not None and start[0] == began:
                rng.put(start[1])  # the iterator draws its seeds as the first time
        self._pass_rng = (began, rng.get()) if self._tracks else None
        if self._pass_rng is not None:
            self._record["pass"] = self._pass_rng
        it = data.resume(loader, self._batch, got["loader"] if got is not None and self._batch else None)
        self._loader = loader if data.stateful(loader) and self._tracks else None
        self._in_pass = True
        try:
            while True:
                if self._lost.is_set():
                    self.recover()
                if self._loader is not None:
                    self._loader_state = loader.state_dict()  # where a redone step's batch is read again
                try:
                    batch = next(it)
                except StopIteration:
                    break
                yield from self._attempts(Step(self, self.step, batch))
        finally:
            self._in_pass, self._loader, self._loader_state = False, None, None
        self._batch = 0

    def committed(self, step: Step) -> None:
        """`step` committed (step.py): it counts as done from here on."""
        self.step = step.index + 1
        if self._in_pass:
            self._batch += 1
        self._keep_record()
        self._committed_here += 1
        progress.job_step(self.step, self._committed_here)  # the agent's goodput, its hang clock

    def _drawn(self) -> None:
        """A backward began: the step drew what it draws and moved its buffers (in the forward). Recorded
        as this rank's state after the step, for its replacement should the others commit the step and
        this rank be lost before its own commit (its draws then stand, and only it had them)."""
        step = self._inflight
        if step is not None and not step.committed and not step.drawn:
            step.drawn = True
            self._keep_record(step.index + 1)

    def _keep_record(self, after: int | None = None) -> None:
        """This rank's own streams and buffers as the steps done leave them, for its replacement (slots.py)."""
        if self._records:
            if not self.in_place:  # in place, each step's start learns it (`Snapshot.take`)
                self._snapshot.watch([m for m in self._kept.values() if isinstance(m, torch.nn.Module)])
            at = self.step if after is None else after
            # By step, the newest two (a step drawn, the one before it done): a node lost whole resumes at
            # the newest step every other rank holds a copy of, which may be the one before.
            streams = self._record.setdefault("afters", {})
            streams[at] = rng.get()
            # A rank's own buffers (batch-norm statistics of its own batches): nobody else holds them.
            kept = self._record.setdefault("buffers", {})
            kept[at] = {k: b.detach().cpu().clone() for k, b in self._own_buffers()}
            for by_step in (streams, kept):
                for old in sorted(by_step)[:-2]:
                    del by_step[old]
            self._slot.write(self._record)

    def torn(self, step: Step) -> str:
        """The kept optimizers a broken step had stepped, if not all of them (step.py)."""
        return self._commits.torn(step)

    def inflight(self) -> Step | None:
        """The step in flight (between its start and its end)."""
        return self._inflight

    def _take_pending(self, index: int, fresh: bool) -> None:
        """Take up the streams this rank must begin step `index` with (a replacement's, or received)."""
        if self._pending is None or self._pending[1] != index:
            return
        kind, _, state = self._pending
        if fresh and kind != "after":
            return
        self._pending = None
        rng.put(state)

    # ------------------------------------------------------------------ rounds

    def _sync_once(self) -> None:
        if not self._synced:
            self._enter(self.round, sync=True, join=False)

    def _enter(
        self,
        rnd: int,
        *,
        sync: bool,
        join: bool = True,
        began: float | None = None,
        marks: list[tuple[str, float]] | None = None,
    ) -> Recovery | None:
        """Join round `rnd` and, with `sync`, bring the state to every rank; a newer round opened
        meanwhile (a fault during the recovery) is joined in its place."""
        while True:
            with self._lock:
                if join:
                    self._lost.clear()
                    self.round = rnd
                self._settling = True
            self._moved.set()
            try:
                if join and self.in_place:
                    # Opened before the watcher could see this rank joining: its wake-up would be missed.
                    if self.store.check([keys.opened(rnd + 1)]):
                        rnd = self._next_round(rnd)
                        continue
                    self.store.set(keys.entering(rnd, self.rank), b"1")
                if join:
                    self._join(rnd)
                    if marks is not None:
                        marks.append(("joined", time.time()))
                done = self._sync(began, marks) if sync else None
                with self._lock:
                    self._settling = False
                return done
            except Exception as e:
                with self._lock:
                    self._settling = False
                if not self.lost(e):
                    raise
                log.info(f"rank {self.rank}: round {rnd} broke while this rank joined it ({type(e).__name__})")
                with self._lock:
                    pg, self._pg = self._pg, None
                abort.leave(pg, self.backend)
                self.model = None
                rnd, join = self._next_round(rnd), True

    def _next_round(self, rnd: int) -> int:
        """The newest round the agent opened after `rnd` (waits for it)."""
        if self._store_shut:  # the watcher woke a join blocked on it
            self.store, self._store_shut = self._connect(is_master=False), False
        self.store.wait([keys.opened(rnd + 1)])
        return max(rnd + 1, int(self.store.get(keys.NEWEST)))

    def _connect(self, is_master: bool) -> dist.TCPStore:
        before = abort.sockets()
        wait = datetime.timedelta(seconds=self.timeout)
        store = dist.TCPStore(self._addr, self._port, is_master=is_master, timeout=wait, wait_for_workers=False)
        self._store_sockets = abort.sockets() - before
        return store

    def _join(self, rnd: int) -> None:
        prefixed = dist.PrefixStore(keys.group_prefix(rnd), self.store)
        wait = datetime.timedelta(seconds=self.timeout)
        before = abort.sockets()
        try:
            dist.init_process_group(
                self.backend, store=prefixed, rank=self.rank, world_size=self.world_size, timeout=wait
            )
        except BaseException:
            # torch named the group that failed to form ("0", the default group's name), and would name
            # the next one "1": in the store under another name than the other ranks' "0".
            world = getattr(dist.distributed_c10d, "_world", None)
            if world is not None and not dist.is_initialized() and hasattr(world, "group_count"):
                world.group_count = 0
            raise
        with self._lock:
            self._pg, self._sockets = dist.group.WORLD, abort.sockets() - before
        self._joined_at = time.time()

    def _sync(self, began: float | None, marks: list[tuple[str, float]] | None) -> Recovery:
        """Agree on who holds the state, move it, make the model, and tell the agent this rank is in."""
        recovering = marks is not None
        began = time.monotonic() if began is None else began
        marks = [("joined", self._joined_at)] if marks is None else marks
        early, self._early = self._early, None  # `resumes()` agreed on this round's plan already
        if early is not None and early[0] == self.round and not self._holds_state:
            plan = early[1]
        else:
            plan = transfer.plan(self._holds_state and bool(self._kept), self.step, self.device, memory.steps(self))
        if plan.memory >= 0 and self.rank not in plan.to:  # no rank holds the state: the copies in memory do
            memory.resume(self, plan.memory)
        marks.append(("planned", time.time()))
        if plan.source < 0 and self.in_place and self.store.check([keys.opened(self.round), keys.HELD]):
            self.leave("every rank that held the job's state was lost: in place has nothing to go on from")
        sent, received, moved = 0, False, time.monotonic()
        if plan.to and self.rank == plan.source:
            sent = transfer.send(self._kept, self._meta(), plan.to, self.device)
        elif self.rank in plan.to:
            memory.settled(self)  # its copy in flight reads what is received into
            self._adopt(transfer.receive(self._kept, plan.source, self.device), plan.source)
            memory.received(self, plan.source, plan.memory)
            received = True
        moved = time.monotonic() - moved
        marks.append(("moved", time.time()))
        for obj in self._kept.values():
            if isinstance(obj, torch.nn.Module):
                obj.zero_grad(set_to_none=True)  # the step in flight left partial gradients
        if self._make is not None:
            self.model = self._make(plan.source < 0)
            ddp.refuse_sharded("wrap(...)", self.model)
        if self._buffers is not None:  # this rank's own buffers, as its predecessor left them
            mine, self._buffers = self._buffers, None
            with torch.no_grad():
                for key, buf in self._own_buffers(every=True):
                    if key in mine:
                        buf.copy_(mine[key])
        self._holds_state, self._synced = True, True
        if self.in_place and self.store.add(keys.joined(self.round), 1) == self.world_size:
            self.store.set(keys.HELD, b"1")
            self.store.set(keys.ready(self.round), b"1")
        marks.append(("made", time.time()))
        done = Recovery(self.round, time.monotonic() - began, sent, received, moved, tuple(marks))
        if recovering or received:
            self.recoveries.append(done)
            rate = f", {sent / moved / 1e9:.2f} GB/s" if sent and moved > 0 else ""
            what = "received the state" if received else "kept"
            what = f"sent the state ({sent / 1e6:.1f} MB{rate})" if sent else what
            if self.in_place:  # else a group restart: the copy's line said it (memory.py)
                log.info(f"rank {self.rank}: in place in round {self.round} after {done.seconds:.3f} s; {what}")
        return done

    def _meta(self) -> dict:
        """The job's own record, sent with the kept state: the position, and the streams to go on with."""
        step = self._inflight
        redo = step is not None and not step.committed and self._snapshot.rng is not None
        streams = ("start", step.index, self._snapshot.rng) if redo else ("after", self.step, rng.get())
        return {
            "step": self.step,
            "epoch": self.epoch,
            "last_epoch": self._last_epoch,
            "batch": self._batch,
            "sampler_epoch": self._sampler_epoch,
            "pass_rng": self._pass_rng,
            # a stateful loader's position before the batch the job resumes at
            "loader": self._loader_state if redo or self._loader is None else self._loader.state_dict(),
            "rng": streams,
            "rank": self.rank,
            "layout": self._layout_now(),
        }

    def _adopt(self, meta: dict, source: int) -> None:
        """Take the sender's position, and the streams: this rank's own where its predecessor left them."""
        self.step, self.epoch, self._last_epoch = meta["step"], meta["epoch"], meta["last_epoch"]
        self._batch, self._received = meta["batch"], meta
        self._layout = meta["layout"] or self._layout
        own = self._own or {}
        self._buffers = own.get("buffers", {}).get(self.step)  # taken up once the model is made (2.4's DDP)
        # "start": taken at the step's start, after any code between steps (in place: the step runs again)
        if "start" in own and own["start"][0] == self.step:
            self._pending = ("start", self.step, own["start"][1])
            return
        if self.step in own.get("afters", {}):
            self._pending = ("after", self.step, own["afters"][self.step])
            return
        if meta["rng"][1] == self.step:
            self._pending = meta["rng"]
            if self._own is None and self.world_size > 1:
                log.info(f"rank {self.rank}: goes on with rank {source}'s random streams (its own were not found)")

    def _own_steps(self) -> tuple[int, ...]:
        """The steps at which this rank's record (its predecessor's: in its node's folder, or the store's
        copy where the node was lost whole) holds its own streams and buffers (slots.covers)."""
        if self._own is None and self._records and self.store.check([keys.slot(self.rank)]):
            self._own = slots.load(self.store.get(keys.slot(self.rank)))
        return slots.covers(self._own)

    def _own_buffers(self, every: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """The kept modules' buffers that change in a step (`every`: all), by a name each rank shares."""
        for name, obj in self._kept.items():
            if isinstance(obj, torch.nn.Module):
                for key, buf in obj.named_buffers():
                    if every or self._snapshot.moving(buf):
                        yield f"{name}.{key}", buf

    def _client(self, timeout: float) -> StoreClient | None:
        try:
            return StoreClient(self._addr, self._port, timeout=timeout)
        except (OSError, StoreError):
            log.warning("in-place recovery: cannot reach the launcher's store", exc_info=True)
            return None

    def _layout_now(self) -> list[list[int]] | None:
        if self._layout is None and self._recorder is not None:
            self._layout = self._recorder.layout()
        return self._layout

    def _finish(self) -> None:
        """Count this rank at the job's end; wait for every rank (recovering a lost one meanwhile)."""
        client: StoreClient | None = None
        try:
            while True:
                if self._store_shut:
                    self.store, self._store_shut = self._connect(is_master=False), False
                rnd = self.round
                if self.store.add(keys.closing(rnd), 1) == self.world_size:
                    self.store.set(keys.finished(rnd), b"1")
                client = client or StoreClient(self._addr, self._port, timeout=max(10.0, 2 * wakeup.WATCH_EVERY))
                while not self._lost.is_set():
                    if client.wait([keys.finished(rnd)], timeout=wakeup.WATCH_EVERY):
                        self._slot.finished(rnd)  # for its agent, should the store's node exit first
                        return
                self.recover()  # a peer was lost before the end: it comes back, and every rank counts again
        finally:
            if client is not None:
                client.close()

    # ------------------------------------------------------------------ leaving

    def leave(self, why: str) -> None:
        """In place cannot go on exactly: say why in one line and exit; the agent restarts the group."""
        self._leaving = True
        leaving.say(self.rank, f"{why}; leaving, the group restarts")
        raise SystemExit(keys.LEAVE_EXIT)
