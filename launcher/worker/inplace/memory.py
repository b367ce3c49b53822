"""The kept state in the node's memory, where any restart of the group finds it (docs/memory.md).

At each step's end (after its commit) each rank copies what `Job.keep` holds (the state_dicts: model
parameters and buffers, optimizer state, GradScaler, scheduler) and the job's own record (the step, the
loader's position, its random streams) into a file of the agent's folder in memory (keys.SLOTS_VAR, in
/dev/shm: the agent owns it and removes it when the job ends, its guard when the agent is SIGKILLed).
A worker's death does not free it; a new worker of the same rank reads it back.

Two copies per rank, written in turn (`state.<rank>.0` and `.1`): a rank killed while it copies leaves
the other whole. Each file is a header (its first 4 kB), the tensors' bytes (mapped, written in place: a
memory copy, or a device-to-host one, never a disk), then the structure (pickled, tensors named by their
place; memfile.py). The header is cleared before a copy and written last, with the structure's sha256: a
torn copy is never loaded.

The replicas once per node: where the job's DDP (`job.ddp`, or `job.wrap`'s) runs over the default group
and the node has more than one rank, every rank of the node holds the same kept parameters and kept
optimizers' state. Decided once, at the first copy (`replicas`). Only the node's local rank 0 writes those
(first in its file, at the places every rank's record names); each rank writes its own part (buffers,
random streams, the job's record, anything else). A rank's copy of a step is whole only where its own
file and local rank 0's file of the same step are (`memfile.pairs`: the same step and layout, the same
history), and it loads the replicas from that file. Every rank's copy of a step is whole before any rank
commits the next: local rank 0's backward, too, waits for its copy.

Off the training path: at the step's end, what the next step's forward and backward may change (the
buffers, the random streams: small) is cloned at once; the kept modules' parameters and the kept
optimizers' state, which only those optimizers' step changes, are copied by a thread beside the next
step's forward. Its backward waits for the copy at its first gradient (no peer can commit the step
before this rank's copy is whole: every rank holds a step in common), as do each kept optimizer's
step, the next copy, the end of a `job.steps` loop, a load and a fork. A kept tensor whose version
moved during its copy tears it (the steps wait for each copy from then on); without a kept optimizer
the step waits for its copy.

A copy belongs to one run id, one world size and rank, and a round at or before the reader's; any other
is ignored with one line. Which step the group resumes at is agreed in transfer.plan: the newest that
every rank holds (each holds its last two steps, and no rank is more than one step ahead of another);
else (a node lost whole) the newest some rank holds and each rank without a copy has its own streams
and buffers of in the store (Job's record, kept across rounds by the agent), which the others receive
from it over the group; else, where told (`any`), the newest any rank holds, with its sender's streams.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import pickle
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import keys, memfile, rng, transfer
from .memfile import DATA, HEADER, MAGIC

log = logging.getLogger(__name__)

# "0": no copy (a job whose state does not fit twice in host memory); "any": a rank without a copy of its
# own resumes from another rank's (its random streams then that rank's); else only where every rank has its own.
OFF_VAR = "LAUNCHER_STATE_IN_MEMORY"


@dataclass(frozen=True)
class Held:
    """One whole copy of this rank's state: the steps done when it was taken, and its file; where the node's
    local rank 0 holds its replicas' tensors (see `replicas`), that rank's file of the same step and
    its header as read (the load checks it unchanged after)."""

    step: int
    path: str
    meta: dict
    lead: str = ""
    header: bytes = b""


class Memory:
    """Rank `rank`'s two copies in `folder` (see the module)."""

    def __init__(
        self,
        folder: str,
        rank: int,
        world: int,
        run_id: str,
        local_rank: int,
        anywhere: bool = False,
        lost: threading.Event | None = None,
        local_world: int = 1,
        since: int = 0,
    ):
        self.folder, self.rank, self.world, self.run_id = folder, rank, world, run_id
        self.local_rank, self.anywhere, self.local_world = local_rank, anywhere, local_world
        # The round this process began in: its copies' history is the group's since then (see `memfile.pairs`).
        self.since = since
        # Whether the node's ranks hold the kept parameters and optimizer state alike (see `replicas`);
        # None: not decided yet.
        self._replicas: bool | None = None
        self._own = 0  # the bytes of each rank's own part of a copy (said in the size line)
        self.paths = [os.path.join(folder, f"state.{rank}.{half}") for half in (0, 1)]
        self._seq = 0
        self._maps: list[tuple[int, torch.Tensor] | None] = [None, None]  # (bytes, the file mapped) per half
        # Per half, what its last whole copy holds at each place of a kept tensor: (the tensor, its address,
        # its version, bytes). A tensor unchanged since (a frozen part) is not written into that half again.
        self._same: list[dict[int, tuple[Any, int, int, int]]] = [{}, {}]
        self.written = 0  # the bytes the newest copy wrote (less what it found unchanged in its half)
        self._said = False
        self._flight: threading.Thread | None = None  # the copy beside the step in flight
        self._dropping = threading.Event()  # set: the copy in flight gives up (a recovery needs the cores)
        self._lost = lost or threading.Event()  # the job's: set once a peer is lost (in place), the same
        self._hooked: set[int] = set()  # id() of the kept optimizers whose step waits for that copy
        self.beside = True  # False: the step waits for each copy (a kept tensor changed beside one)
        self.waited = 0.0  # seconds the job waited for copies in flight, all told
        self.copied = 0.0  # seconds the newest copy took
        os.register_at_fork(before=self.wait)  # a loader's workers: no fork beside a thread inside torch's copy

    @classmethod
    def open(cls, environ: Any, rank: int, world: int, lost: threading.Event | None = None) -> Memory | None:
        """This rank's copies, where the agent gave its workers a folder in memory (and the copy is not off)."""
        folder = environ.get(keys.SLOTS_VAR)
        if not folder or environ.get(OFF_VAR) == "0" or not os.path.isdir(folder):
            return None
        run_id, anywhere = environ.get("TORCHELASTIC_RUN_ID", ""), environ.get(OFF_VAR) == "any"
        local, local_world = int(environ.get("LOCAL_RANK", "0")), int(environ.get("LOCAL_WORLD_SIZE", "1"))
        since = int(environ.get("LAUNCHER_ROUND", environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
        return cls(folder, rank, world, run_id, local, anywhere, lost, local_world, since)

    @property
    def lead(self) -> int:
        """The rank of this node's local rank 0 (the agent numbers a node's ranks in a row)."""
        return self.rank - self.local_rank

    # ------------------------------------------------------------------ the copy

    def save(self, kept: dict[str, Any], meta: dict, rnd: int, model: Any = None) -> None:
        """Copy the kept objects' state and the job's `meta` (its `step` names the copy) into the older half:
        beside the next step where a kept optimizer's step is the only change to the big tensors, else now.
        `model` (the job's, e.g. its DDP): at the first copy, whether the node's ranks hold replicas."""
        self.wait()  # the copy before it: whole, or given up (it wrote the other half)
        for obj in kept.values():
            if id(obj) in self._hooked:
                continue
            if isinstance(obj, torch.optim.Optimizer):
                self._hooked.add(id(obj))  # its step changes the tensors copied beside the step: it waits first
                obj.register_step_pre_hook(lambda *_: self.wait())
            elif isinstance(obj, torch.nn.Module):
                # And the backward, at its first gradient: no peer's step can commit (its gradients' all-reduce
                # needs this rank's) before this rank's copy is whole, so every rank holds a step in common.
                # Local rank 0's copy holds the node's replicas: no step commits before that one is whole either.
                self._hooked.add(id(obj))
                for param in obj.parameters():
                    if param.requires_grad:
                        param.register_post_accumulate_grad_hook(lambda _: self.wait())
        if self._replicas is None:
            # Once, before the first copy (every rank of the node decides alike: the same script, the same DDP).
            self._replicas = self.local_world > 1 and replicas(model, kept)
        tensors: list[torch.Tensor] = []
        structure = {name: transfer.strip(obj.state_dict(), tensors) for name, obj in kept.items()}
        record = {"run_id": self.run_id, "world": self.world, "rank": self.rank, "local_rank": self.local_rank}
        record.update(round=rnd, step=meta["step"], since=self.since, lead=self.lead)
        record.update(state=structure, meta=transfer.strip(meta, tensors))  # its tensors: the random streams
        owners = _stepped(kept)
        shared = set(owners) if self._replicas else set()
        # The replicas' tensors first, at the same places in every rank's layout: local rank 0's file holds
        # them, the others' files their own part alone (from DATA on), and the replicas' places name them.
        common = [i for i, t in enumerate(tensors) if t.data_ptr() in shared]
        mine = [i for i, t in enumerate(tensors) if t.data_ptr() not in shared]
        places, end = [0] * len(tensors), DATA
        for i in common:
            places[i], end = end, end + memfile.aligned(tensors[i])
        record["replicas"] = tuple((i, places[i], memfile.nbytes(tensors[i])) for i in common)
        start = end = end if self.local_rank == 0 else DATA
        for i in mine:
            places[i], end = end, end + memfile.aligned(tensors[i])
        record["places"] = places
        written = range(len(tensors)) if self.local_rank == 0 else mine
        tensors, at = [tensors[i] for i in written], [places[i] for i in written]
        later = owners if self.beside else {}
        marks = [_mark(owners.get(t.data_ptr())) for t in tensors]  # read before any clone below
        versions = [(t, t._version) for t in tensors if t.data_ptr() in later]
        if versions:  # read beside the next step; what its forward changes (batch-norm statistics), or may
            # (what is not a kept module's parameter or a kept optimizer's state), is copied now: small.
            tensors = [t if t.data_ptr() in later else t.clone() for t in tensors]
        blob = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        self._own = end - start + len(blob) if common else 0
        ready = None
        if versions and any(t.is_cuda for t in tensors):  # the side stream starts after the clones above
            ready = torch.cuda.Event()
            ready.record()
        copy = (self._seq + 1, tensors, at, end, blob, meta["step"], versions, ready, marks)
        if not versions:
            self._write(*copy)
            return
        # Not a daemon: an interpreter that exits waits for it (the step's copy ends whole).
        self._flight = threading.Thread(target=self._write, args=copy, name="launcher-state-copy")
        self._flight.start()

    def _dropped(self) -> bool:
        """The copy in flight gives up: dropped, or a peer lost (the backward waiting for it would hold the
        recovery, and the copy would share the cores with the state's transfer)."""
        return self._dropping.is_set() or self._lost.is_set()

    def drop(self) -> None:
        """Give up the copy in flight (its half stays torn; the other holds the step before): a recovery in
        place sends or keeps the state, and the copy would share the cores and memory bandwidth with it."""
        self._dropping.set()
        self.wait()
        self._dropping.clear()

    def wait(self) -> None:
        """Until the copy in flight is whole in its file (or given up)."""
        flight, self._flight = self._flight, None
        if flight is not None:
            began = time.monotonic()
            flight.join()
            self.waited += time.monotonic() - began

    def _write(
        self,
        seq: int,
        tensors: list[torch.Tensor],
        places: list[int],
        end: int,
        blob: bytes,
        step: int,
        versions: list[tuple[torch.Tensor, int]],
        ready: Any,
        marks: list[tuple[Any, int, int] | None],
    ) -> None:
        """Write copy `seq` into its half; its header last, once its tensors are whole (see the module)."""
        began, half = time.monotonic(), seq % 2
        path = self.paths[half]
        seen, self._same[half] = self._same[half], {}  # until this copy is whole, the half holds nothing sure
        same = [_unchanged(seen.get(at), mark) for at, mark in zip(places, marks)]
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, bytes(HEADER.size), 0)  # cleared first: a copy torn from here on is never loaded
                self._copy(fd, half, end, [t for t, s in zip(tensors, same) if not s],
                           [at for at, s in zip(places, same) if not s], ready)  # fmt: skip
                moved = [t for t, v in versions if t._version != v]
                if moved:  # changed beside its copy, not by a kept optimizer's step: this copy is torn
                    self.beside = False
                    log.info(
                        f"rank {self.rank}: a kept tensor {tuple(moved[0].shape)} changed outside the kept "
                        "optimizers' step while it was copied to memory; the step waits for the copy from now on"
                    )
                    return
                os.pwrite(fd, blob, end)
                digest = hashlib.sha256(blob).digest()
                os.pwrite(fd, HEADER.pack(MAGIC, seq, step, end, len(blob), digest), 0)
            finally:
                os.close(fd)
        except memfile.Dropped:  # a recovery took the cores: the other half holds the step before
            return
        except OSError:  # the folder is gone (the agent ends the job): nothing to keep it for any more
            log.debug("state in memory: could not write %s", path, exc_info=True)
            return
        except Exception:  # in the copy's thread: said, and the other half stands
            log.warning("state in memory: the copy to %s failed", path, exc_info=True)
            return
        self._seq, self.copied = seq, time.monotonic() - began
        self._same[half] = {at: (*mark, memfile.nbytes(t)) for t, at, mark in zip(tensors, places, marks) if mark}
        self.written = sum(memfile.nbytes(t) for t, s in zip(tensors, same) if not s)
        if not self._said and self.local_rank == 0:
            self._said = True
            where = (
                f"two per node (the replicas' state once for the node's {self.local_world} ranks; "
                f"{memfile.size(self._own)} of each rank's own)"
                if self._own
                else "two per rank"
            )
            log.info(
                f"rank {self.rank}: the kept state is copied to memory at each step's end: {memfile.size(end)} a copy"
                f", {where} ({self.folder})"
            )

    def _copy(self, fd: int, half: int, end: int, tensors: list[torch.Tensor], places: list[int], ready: Any) -> None:
        """Each tensor into its place in the file: a host tensor written from its own bytes (one thread, no
        intra-op pool beside the step's), a GPU's copied into the file mapped (on a stream of its own,
        after `ready`)."""
        stream = None
        if ready is not None:
            stream = torch.cuda.Stream()
            stream.wait_event(ready)
        with torch.no_grad(), torch.cuda.stream(stream):  # None: the current one
            for t, at in zip(tensors, places):
                nbytes = memfile.nbytes(t)
                if not nbytes:
                    continue
                if t.device.type == "cpu" and t.is_contiguous():
                    memfile.pwrite(fd, t.data_ptr(), nbytes, at, self._dropped)
                else:
                    self._map(half, end)[at : at + nbytes].view(t.dtype).view(t.shape).copy_(t)
        if stream is not None:
            stream.synchronize()

    def _map(self, half: int, size: int) -> torch.Tensor:
        """The half's file mapped (shared: written through to it), grown to `size` bytes where smaller."""
        mapped = self._maps[half]
        if mapped is None or mapped[0] < size:
            self._maps[half] = None
            mapped = (size, torch.from_file(self.paths[half], shared=True, size=size, dtype=torch.uint8))
            self._maps[half] = mapped
        return mapped[1]

    # ------------------------------------------------------------------ the load

    def held(self, rnd: int) -> list[Held]:
        """This rank's whole copies that fit this job (another job's or world's are said in one line); where
        the node's same local rank wrote newer ones as another rank (the re-formed group gave this node other
        ranks), those: the replicas' state is the same, the random streams that rank's (said in one line).
        A copy whose replicas local rank 0's file holds is whole only where that file holds them at its step."""
        self.wait()
        found: list[Held] = []
        for path in self.paths:
            record = memfile.read(path)
            if record is None:
                continue
            why = self._misfit(record, rnd)
            if why:
                log.warning(f"rank {self.rank}: the state's copy in memory {path} is {why}: ignored")
                continue
            found.extend(self._whole(path, record, rnd))
        renamed = self._renamed(rnd) if self.anywhere else []
        if renamed and renamed[0].step > max((h.step for h in found), default=-1):
            was = renamed[0].meta["rank"]
            log.warning(
                f"rank {self.rank}: this node's local rank {self.local_rank} last ran as rank {was}: resuming from "
                f"that rank's copy in memory (the same state; rank {was}'s random streams)"
            )
            found = renamed
        self._seq = max([self._seq, *(h.meta.get("seq", 0) for h in found)])
        return sorted(found, key=lambda h: -h.step)

    def _renamed(self, rnd: int) -> list[Held]:
        """The copies the node's same local rank wrote as its newest other rank of this job and world."""
        by_rank: dict[int, list[Held]] = {}
        for name in os.listdir(self.folder):
            path = os.path.join(self.folder, name)
            if not name.startswith("state.") or path in self.paths:
                continue
            record = memfile.read(path)
            if record is None or record.get("local_rank") != self.local_rank or self._misfit(record, rnd, anyrank=True):
                continue
            by_rank.setdefault(record["rank"], []).extend(self._whole(path, record, rnd))
        newest = max((c for c in by_rank.values() if c), key=lambda c: max(h.step for h in c), default=[])
        return sorted(newest, key=lambda h: -h.step)

    def _whole(self, path: str, record: dict, rnd: int) -> list[Held]:
        """[the copy in `path`] where it is whole: its own file, and local rank 0's copy of the same step where
        that one holds its replicas' tensors; else []."""
        if not record.get("replicas") or record.get("local_rank") == 0:
            return [Held(record["step"], path, record)]
        for half in (0, 1):
            lead = os.path.join(self.folder, f"state.{record['lead']}.{half}")
            header = memfile.header(lead)
            other = memfile.read(lead)
            if other is not None and memfile.pairs(record, other, rnd) and memfile.header(lead) == header:
                return [Held(record["step"], path, record, lead, header)]
        return []

    def _misfit(self, record: dict, rnd: int, anyrank: bool = False) -> str:
        if record.get("run_id") != self.run_id:
            return f"another job's (run id {record.get('run_id')!r}, this one {self.run_id!r})"
        if record.get("world") != self.world or not (anyrank or record.get("rank") == self.rank):
            return (
                f"from another world (rank {record.get('rank')} of {record.get('world')}, "
                f"this one rank {self.rank} of {self.world})"
            )
        if record.get("round", 0) > rnd:
            return f"from round {record['round']}, after this one ({rnd})"
        return ""

    def load(self, held: Held, kept: dict[str, Any]) -> tuple[dict, int]:
        """Put copy `held` into the kept objects (its replicas from local rank 0's file of the same step, where
        that one holds them); returns the job's record and the bytes read."""
        record = held.meta
        places: list[int] = record["places"]
        structure = {"state": record["state"], "meta": record["meta"]}
        # Copied straight into the tensors the job holds already (its parameters) where it has them.
        slots, targets = transfer.landing(structure, kept)
        data = memfile.mapped(held.path)
        common = {i for i, _, _ in record.get("replicas", ())} if held.lead else set()
        # Read only at the group's first sync, before any rank's first step ends: local rank 0 writes its
        # next copy after that step's commit, whose all-reduce needs every rank's backward, after its load.
        lead = memfile.mapped(held.lead) if common else data
        tensors = []
        with torch.no_grad():
            for s, target in zip(slots, targets):
                at = places[s.index]
                nbytes = math.prod(s.shape) * s.dtype.itemsize
                source = lead if s.index in common else data
                view = source[at : at + nbytes].view(s.dtype).view(s.shape)
                # Else a copy: the job's own memory (the file is written again at the next step).
                tensors.append(target.copy_(view) if target is not None else view.to(s.device, copy=True))
        if common and memfile.header(held.lead) != held.header:  # never: a rewrite clears the header first
            raise RuntimeError(f"rank {self.rank}: local rank 0's copy {held.lead} changed while it was loaded")
        return transfer.put(structure, tensors, targets, kept), sum(memfile.nbytes(t) for t in tensors)


def replicas(model: Any, kept: dict[str, Any]) -> bool:
    """Whether every rank holds the kept modules' parameters and the kept optimizers' state alike, where that
    is sure: `model` (the job's) is a DistributedDataParallel over the default process group of a kept
    module (`job.ddp(module)`, or one `job.wrap` made), told to ignore none of its parameters. Then
    the rest of the kept state is the replicas' too: in place already sends a newcomer a survivor's whole
    state, and a node lost whole resumes from another node's. Not otherwise: no DDP, a group of its own
    (`process_group=`, a device mesh: ranks in other groups hold other values), a pipeline's stage per rank,
    parameters DDP leaves to the script (an expert's per rank)."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if not isinstance(model, DistributedDataParallel) or not dist.is_initialized():
        return False
    if model.process_group is not dist.distributed_c10d._get_default_group() or model.parameters_to_ignore:
        return False
    ours = {id(p) for obj in kept.values() if isinstance(obj, torch.nn.Module) for p in obj.parameters()}
    return any(id(p) in ours for p in model.module.parameters())


def _stepped(kept: dict[str, Any]) -> dict[int, torch.Tensor]:
    """Where the tensors are that only a kept optimizer's step changes (address -> the tensor): the kept
    modules' parameters, and the optimizers' own state (its moments). Their copy may run beside the next
    step (none without a kept optimizer: the script changes its parameters itself)."""
    found: dict[int, torch.Tensor] = {}
    if not any(isinstance(obj, torch.optim.Optimizer) for obj in kept.values()):
        return found
    for obj in kept.values():
        if isinstance(obj, torch.nn.Module):
            found.update((p.data_ptr(), p) for p in obj.parameters())
        elif isinstance(obj, torch.optim.Optimizer):
            tensors = (t for state in obj.state.values() for t in state.values() if torch.is_tensor(t))
            found.update((t.data_ptr(), t) for t in tensors)
    return found


def _mark(owner: torch.Tensor | None) -> tuple[Any, int, int] | None:
    """What tells a kept tensor unchanged at the next copy into the same half: itself (weakly), its address
    and its version (any in-place change moves it; a change through `.data` does not: docs/memory.md)."""
    return None if owner is None else (weakref.ref(owner), owner.data_ptr(), owner._version)


def _unchanged(was: tuple[Any, int, int, int] | None, mark: tuple[Any, int, int] | None) -> bool:
    """The half's last whole copy holds this tensor's bytes as they are now, at the same place."""
    if was is None or mark is None:
        return False
    owner = mark[0]()
    return owner is not None and was[0]() is owner and was[1:3] == mark[1:] and was[3] == memfile.nbytes(owner)


def steps(job: Any) -> transfer.Copies:
    """The steps this rank's two copies were taken at (-1: none), for transfer.plan (none where it holds state:
    its copy in flight goes on beside the sync, which only reads the tensors it reads, unless it receives)."""
    memory = job._memory
    if memory is not None and job._holds_state:
        memory.drop()  # in place: the next step's end copies again
    if memory is None or job._holds_state or not job._kept:
        return transfer.Copies()
    job._held = memory.held(job.round)
    found = [h.step for h in job._held] + [-1, -1]
    return transfer.Copies(found[0], found[1], memory.anywhere, () if job._held else job._own_steps())


def settled(job: Any) -> None:
    """Until this rank's copy in flight is whole: the state is about to be received into the tensors it reads."""
    if job._memory is not None:
        job._memory.wait()


def received(job: Any, source: int, step: int) -> None:
    """Say, where the group resumed from the copies in memory at `step` (-1: it did not), that this rank
    (holding none: its node was lost whole) received `source`'s and took up its own streams."""
    if step >= 0 and step in (job._own or {}).get("afters", {}):
        log.info(
            f"rank {job.rank}: resumed at step {step} from rank {source}'s copy in memory (this rank holds none), "
            "with its own random streams and buffers from the launcher's store"
        )


def resume(job: Any, step: int) -> None:
    """Load this rank's copy at `step` (transfer.plan agreed on it) and take up its position and streams."""
    memory, began = job._memory, time.monotonic()
    held = next(h for h in job._held if h.step == step)
    job._held = []
    assert memory is not None
    meta, nbytes = memory.load(held, job._kept)
    if job._own is None:
        job._own = {}  # its own streams are the copy's (no "goes on with another rank's" line)
    job._adopt(meta, job.rank)
    # Also what it sends a rank without a copy before its loader's pass begins (`Job._meta`)
    job._pass_rng, job._loader_state, job._sampler_epoch = meta["pass_rng"], meta["loader"], meta["sampler_epoch"]
    if meta["rng"][1] == job.step:
        rng.put(meta["rng"][2])  # the streams it goes on with (and sends a rank without a copy)
    job._holds_state = True
    log.info(
        f"rank {job.rank}: resumed at step {job.step} from its copy in memory "
        f"({memfile.size(nbytes)} in {time.monotonic() - began:.2f} s)"
    )
