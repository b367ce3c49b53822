"""One copy of a rank's state in memory, as a file (memory.py): its header, its layout, the write of a
live tensor's bytes into it, and its read back.

A file is a header (its first 4 kB: the magic, the copy's sequence number, 0 while it is written, its
step, the structure's offset, length and sha256), the tensors' bytes from DATA on (each at an offset
aligned to ALIGN), then the structure (pickled, tensors named by their place). A rank's file holds all
its tensors, or, where the node's ranks hold replicas, its own part alone: its record's "replicas" names
the tensors the node's local rank 0's file of the same step holds, and where (`pairs`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import pickle
import struct
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

MAGIC = b"LMEMv1\0\0"
HEADER = struct.Struct("<8sQQQQ32s")  # magic, seq (0: being written), step, structure's offset, length, sha256
DATA = 4096  # the tensors' bytes start here
ALIGN = 64  # each tensor's offset: any dtype's view of the bytes is aligned


def nbytes(t: torch.Tensor) -> int:
    """The bytes of `t`'s elements."""
    return t.numel() * t.element_size()


def aligned(t: torch.Tensor) -> int:
    """The bytes `t` takes in a copy's file: its own, rounded up to ALIGN."""
    return -(-nbytes(t) // ALIGN) * ALIGN


def size(n: int) -> str:
    """`n` bytes, as the lines say them."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


CHUNK = 64 << 20  # a copy looks whether it is dropped between writes of this many bytes


class Dropped(Exception):
    """The copy in flight was given up (`Memory.drop`): its half stays torn, never loaded."""


def pwrite(fd: int, address: int, count: int, at: int, dropped: Callable[[], bool]) -> None:
    """The `count` bytes at `address` (a live tensor's) into the file at `at` (the GIL released meanwhile)."""
    view = memoryview((ctypes.c_char * count).from_address(address)).cast("B")
    done = 0
    while done < count:
        if dropped():
            raise Dropped
        done += os.pwrite(fd, view[done : done + CHUNK], at + done)


def mapped(path: str) -> torch.Tensor:
    """The file's bytes, mapped privately (read only here)."""
    return torch.from_file(path, shared=False, size=os.path.getsize(path), dtype=torch.uint8)


def header(path: str) -> bytes:
    """The file's header as it is now (b"": none)."""
    try:
        with open(path, "rb") as f:
            return f.read(HEADER.size)
    except OSError:
        return b""


def pairs(record: dict, lead: dict, rnd: int) -> bool:
    """Local rank 0's copy `lead` holds the replicas of this rank's copy `record`: the same job, world, step and
    replicas' layout, a round at or before the reader's, and the same history: each written after the other's
    writer began (a group restart's first round is after every copy of the group before; in place, the state
    goes on from a survivor's, and a newcomer writes only the steps committed with it)."""
    same = ("run_id", "world", "step", "replicas")
    return (
        all(lead.get(k) == record.get(k) for k in same)
        and lead.get("local_rank") == 0
        and lead.get("rank") == record.get("lead")
        and lead.get("round", 0) <= rnd
        and lead.get("round", 0) >= record.get("since", 0)
        and record.get("round", 0) >= lead.get("since", 0)
    )


def read(path: str) -> dict | None:
    """The structure of the whole copy in `path` (None: none, torn, or unreadable)."""
    try:
        with open(path, "rb") as f:
            magic, seq, step, at, length, digest = HEADER.unpack(f.read(HEADER.size))
            if magic != MAGIC or seq == 0:
                return None
            f.seek(at)
            blob = f.read(length)
        if hashlib.sha256(blob).digest() != digest:
            return None
        record = pickle.loads(blob)
        record["seq"] = seq
        return record if record.get("step") == step else None
    except FileNotFoundError:
        return None
    except (OSError, struct.error, pickle.UnpicklingError, EOFError, ValueError, AttributeError):
        log.warning("state in memory: the copy %s is unreadable", path, exc_info=True)
        return None
