"""The newcomer's state, sent by a survivor over the new process group: never read from a file.

Every rank tells the others whether it holds the job's state and at which step (one all_gather);
the lowest rank among those furthest ahead sends it, point to point, to every rank that lacks it
or is behind. The structure (state_dicts with the tensors taken out, and the job's own record: the
step, the loader's position, the random streams) goes as
one pickled object; the tensors go as they are, small ones packed together into buckets, and a
module's tensors land straight in the receiver's own parameters. The receiver faults in the pages
of each tensor before it receives into it: a page fault inside the socket's read stalls the sender
(on this VM a fresh 1 GB then arrived at 0.1-0.2 GB/s, faulted in first at 0.7 GB/s).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

BUCKET = 16 << 20  # bytes: tensors smaller than this travel packed together
PAGE = 4096  # bytes: one write per page faults a fresh allocation in


@dataclass(frozen=True)
class Slot:
    """Where a tensor was, in the structure sent ahead of the tensors."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str  # where the sender held it; the receiver puts it there too


@dataclass(frozen=True)
class Plan:
    """Who sends the state to whom in this round (empty `to`: nobody needs it)."""

    source: int
    to: tuple[int, ...]
    step: int
    memory: int = -1  # the step every rank not in `to` loads from its copy in memory (memory.py); -1: none


@dataclass(frozen=True)
class Copies:
    """The steps of this rank's two copies in memory (-1: none); the steps at which the store holds its own
    streams and buffers (a rank without a copy goes on exactly from another rank's copy there); and whether
    it may resume from another rank's copy without them (`LAUNCHER_STATE_IN_MEMORY=any`: other streams)."""

    newest: int = -1
    before: int = -1
    anywhere: bool = False
    records: tuple[int, ...] = ()


def plan(has_state: bool, step: int, device: torch.device, copies: Copies = Copies()) -> Plan:
    """Agree, with every rank, on who sends the state and who receives it; where no rank holds it, on
    the step of the copies in memory (`copies`: this rank's) the group resumes at."""
    world = dist.get_world_size()
    records = [*copies.records[:2], -1, -1][:2]
    row = [int(has_state), step, copies.newest, copies.before, *records]
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    rows = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(rows, mine)
    told = [tuple(int(x) for x in row.tolist()) for row in rows]
    holders = [r for r, (held, *_) in enumerate(told) if held]
    if not holders:
        held = [{s for s in row[2:4] if s >= 0} for row in told]
        best = resumed_at(held, copies.anywhere, [{s for s in row[4:] if s >= 0} for row in told])
        if best < 0 and any(held) and dist.get_rank() == 0:
            lacking = ", ".join(str(r) for r, steps in enumerate(held) if not steps)
            why = lacking and (
                f" (rank(s) {lacking} hold none: a node lost whole, and the store no record of their own random "
                "streams at a step the others hold)"
            )
            log.warning(
                "the group starts from the script's own state, not from the copies in memory: no step is held "
                f"by every rank{why}, and another rank's copy would give a rank other random streams than an "
                "undisturbed run (LAUNCHER_STATE_IN_MEMORY=any resumes from it all the same)"
            )
        if best < 0:  # the job's first round, or no step every rank holds: the script's own state
            return Plan(-1, (), step)
        loaders = [r for r, steps in enumerate(held) if best in steps]
        return Plan(loaders[0], tuple(r for r in range(world) if r not in loaders), best, best)
    best = max(told[r][1] for r in holders)
    source = min(r for r in holders if told[r][1] == best)
    return Plan(source, tuple(r for r, (held, s, *_) in enumerate(told) if not held or s < best), best)


def resumed_at(held: list[set[int]], anywhere: bool, records: list[set[int]] | None = None) -> int:
    """The step the group resumes at from the copies in memory (`held`: each rank's steps; -1: none). The
    newest some rank holds a copy of and every other rank a copy or, in `records`, its own streams and
    buffers at (each loads its own copy, or receives the state and takes up its own record: exact); else,
    `anywhere`, the newest any rank holds (sent to the others, who go on with the sender's streams)."""
    records = records or [set() for _ in held]
    some = set.union(*held)
    exact = set.intersection(*(h | r for h, r in zip(held, records))) & some
    return max(exact or (some if anywhere else set()), default=-1)


def send(kept: Mapping[str, Any], meta: dict, to: tuple[int, ...], device: torch.device) -> int:
    """Send the kept objects' state and the job's `meta` to ranks `to`; returns the bytes sent once."""
    tensors: list[torch.Tensor] = []
    structure = {
        "state": {name: strip(obj.state_dict(), tensors) for name, obj in kept.items()},
        "meta": strip(meta, tensors),
    }
    for dst in to:
        dist.send_object_list([structure], dst=dst)
        for group in _buckets(tensors):
            if len(group) == 1:
                dist.send(tensors[group[0]].to(device).contiguous(), dst=dst)
            else:
                dist.send(torch.cat([tensors[i].to(device).reshape(-1) for i in group]), dst=dst)
    return sum(t.numel() * t.element_size() for t in tensors)


def receive(kept: Mapping[str, Any], source: int, device: torch.device) -> dict:
    """Receive from `source` what `send` sent, load it into the kept objects; returns the sender's `meta`."""
    box: list[Any] = [None]
    dist.recv_object_list(box, src=source)
    structure = box[0]
    slots, targets = landing(structure, kept)  # received in place where the receiver holds a tensor like it
    tensors = [
        t if t is not None and t.device == device else torch.empty(s.shape, dtype=s.dtype, device=device)
        for t, s in zip(targets, slots)
    ]
    for group in _buckets(tensors):
        if len(group) == 1:
            t = tensors[group[0]]
            buf = t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
            _touch(buf)
            dist.recv(buf, src=source)
            if buf is not t:
                t.copy_(buf)
        else:
            flat = torch.empty(sum(tensors[i].numel() for i in group), dtype=tensors[group[0]].dtype, device=device)
            _touch(flat)
            dist.recv(flat, src=source)
            at = 0
            for i in group:
                n = tensors[i].numel()
                tensors[i].copy_(flat[at : at + n].view_as(tensors[i]))
                at += n
    for i, (t, s) in enumerate(zip(targets, slots)):  # back where the sender held each tensor
        if t is not None and t is not tensors[i]:
            t.copy_(tensors[i])
        tensors[i] = t if t is not None else tensors[i].to(s.device)
    return put(structure, tensors, targets, kept)


def landing(structure: Mapping, kept: Mapping[str, Any]) -> tuple[list[Slot], list[torch.Tensor | None]]:
    """The tensors of `structure` (what `strip` left of {"state": the kept state_dicts, "meta": ...}) in
    order, and for each the kept object's own tensor of its shape and dtype where one is (None: none)."""
    slots = sorted(_slots(structure), key=lambda s: s.index)
    targets: list[torch.Tensor | None] = [None] * len(slots)
    for name, obj in kept.items():
        if name in structure["state"]:
            _match(structure["state"][name], obj.state_dict(), targets)
    return slots, targets


def put(structure: Mapping, tensors: list[torch.Tensor], targets: list, kept: Mapping[str, Any]) -> dict:
    """Load `tensors` (the structure's, in order; `targets` from `landing`) into the kept objects; returns
    the structure's "meta" with its tensors."""
    state_of = structure["state"]
    state = _fill(state_of, tensors)
    for name, obj in kept.items():
        if name not in state_of:
            continue
        if isinstance(obj, torch.nn.Module) and all(targets[s.index] is not None for s in _slots(state_of[name])):
            continue  # its parameters and buffers hold the tensors already
        obj.load_state_dict(state[name])
    return _fill(structure["meta"], tensors)


def _touch(t: torch.Tensor) -> None:
    """Write one byte per page of contiguous `t` (in host memory): a fresh allocation's faults, taken now."""
    if t.device.type == "cpu" and t.numel() * t.element_size() >= 2 * PAGE:
        # Received whole right after: the bytes written here are overwritten.
        t.reshape(-1).view(torch.uint8)[::PAGE].zero_()


_PLAIN = frozenset({int, float, bool, str, bytes, type(None)})  # what holds no tensor, told without an ABC check


def strip(value: Any, tensors: list[torch.Tensor]) -> Any:
    """`value` with each tensor replaced by its Slot (the tensor appended to `tensors`)."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach())
        return Slot(len(tensors) - 1, tuple(value.shape), value.dtype, str(value.device))
    if isinstance(value, Mapping):
        return {k: strip(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(strip(v, tensors) for v in value)
    return value


def _match(sent: Any, own: Any, targets: list[torch.Tensor | None]) -> None:
    """Where `own` (the receiver's state_dict) holds a tensor like the one sent, receive into it."""
    if isinstance(sent, Slot):
        if isinstance(own, torch.Tensor) and (tuple(own.shape), own.dtype) == (sent.shape, sent.dtype):
            targets[sent.index] = own
    elif isinstance(sent, Mapping) and isinstance(own, Mapping):
        for key, value in sent.items():
            if key in own:
                _match(value, own[key], targets)
    elif isinstance(sent, (list, tuple)) and isinstance(own, (list, tuple)) and len(sent) == len(own):
        for value, mine in zip(sent, own):
            _match(value, mine, targets)


def _slots(value: Any):
    if isinstance(value, Slot):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _slots(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _slots(v)


def _fill(value: Any, tensors: list[torch.Tensor]) -> Any:
    """`value` with each Slot replaced by its received tensor."""
    if isinstance(value, Slot):
        return tensors[value.index]
    if isinstance(value, Mapping):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, tensors) for v in value)
    return value


def _buckets(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Indexes of `tensors` in send order: a big tensor alone, runs of small ones of one dtype together."""
    groups: list[list[int]] = []
    size = 0
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        last = groups[-1] if groups else None
        small = nbytes < BUCKET
        if small and last and size + nbytes <= BUCKET and tensors[last[-1]].dtype == t.dtype and size:
            last.append(i)
            size += nbytes
        else:
            groups.append([i])
            size = nbytes if small else 0
    return groups
