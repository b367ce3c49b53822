"""Each rank's own state in the node's memory, where its replacement finds it: its random streams at
the start of each step and after each commit, at the start of the epoch's loader, and its own buffers
(the agent owns the folder, in /dev/shm, and removes it when the job ends: keys.SLOTS_VAR).

A rank's streams are its own (a script may seed them per rank); the survivors cannot send what only
the lost rank drew. The record is small (~10 kB) and written twice a step, so it is a file written in
place: two halves written in turn, then a header naming the newer, so that a rank killed mid-write
leaves the previous record whole. A thread copies the newest record to the launcher's store too
(`Mirror`), for a replacement on another node when this node is lost whole (a spare's); it sends the
newest only, never waits for the step, and a copy that fell behind is known by its step and not used.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import struct
import threading
from collections.abc import Callable
from typing import Any

import torch

from . import keys

log = logging.getLogger(__name__)

HEADER = struct.Struct("<QQ32s")  # sequence number, length, sha256 of the record the sequence names
HALF = 1 << 16  # bytes per half at first; a bigger record grows the file


class Slot:
    """Rank `rank`'s record in `folder` (None: no file) and, through `mirror`, in the store (None: not)."""

    def __init__(self, folder: str | None, rank: int, mirror: Callable[[bytes], None] | None = None):
        self.folder = folder
        self.path = os.path.join(folder, f"rank{rank}") if folder else None
        self.mirror = mirror
        self._lock = threading.Lock()  # written from the main thread and from autograd's (at a backward's start)
        self._fd: int | None = None
        self._seq = 0
        self._half = HALF

    def read(self) -> dict[str, Any] | None:
        """The newest whole record a process of this rank wrote (a replacement reads its predecessor's)."""
        if self.path is None or not os.path.exists(self.path):
            return None
        try:
            with open(self.path, "rb") as f:
                seq, length, digest = HEADER.unpack(f.read(HEADER.size))
                half = (os.fstat(f.fileno()).st_size - HEADER.size) // 2
                f.seek(HEADER.size + (seq % 2) * half)
                data = f.read(length)
            if seq == 0 or hashlib.sha256(data).digest() != digest:
                return None
            self._seq, self._half = seq, max(half, HALF)
            return pickle.loads(data)
        except (OSError, struct.error, pickle.UnpicklingError, EOFError, ValueError):
            log.warning("in-place recovery: this rank's record in %s is unreadable", self.path, exc_info=True)
            return None

    def finished(self, rnd: int) -> None:
        """Say in the node's folder that every rank finished the job in round `rnd` (keys.finished_file)."""
        if self.folder:
            try:
                open(keys.finished_file(self.folder, rnd), "wb").close()
            except OSError:  # the agent ended the job and removed its folder: nobody is left to tell
                log.debug("in-place recovery: could not mark the job finished in %s", self.folder, exc_info=True)

    def write(self, record: dict[str, Any]) -> None:
        """Replace the record (the other half first, then the header), and its copy in the store."""
        if self.path is None and self.mirror is None:
            return
        with self._lock:
            self._write(dumps(record))

    def _write(self, data: bytes) -> None:
        if self.mirror is not None:
            self.mirror(data)
        if self.path is None:  # the store's copy alone (a group restart's records: memory.py)
            return
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                if os.fstat(self._fd).st_size < HEADER.size + 2 * self._half:
                    os.ftruncate(self._fd, HEADER.size + 2 * self._half)
            if len(data) > self._half:  # grow: both halves move, so the header comes last as always
                self._half = 1 << (len(data) - 1).bit_length()
                os.ftruncate(self._fd, HEADER.size + 2 * self._half)
            seq = self._seq + 1
            os.pwrite(self._fd, data, HEADER.size + (seq % 2) * self._half)
            os.pwrite(self._fd, HEADER.pack(seq, len(data), hashlib.sha256(data).digest()), 0)
            self._seq = seq
        except OSError:  # the folder is gone (the agent ends the job): the record is not needed any more
            log.debug("in-place recovery: could not write %s", self.path, exc_info=True)
            self.path = None


_NUMPY = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
          torch.bool}  # fmt: skip


class _Pickler(pickle.Pickler):
    """Plain CPU tensors as NumPy arrays: a record is written up to three times a step, and torch's own
    reduction of a small tensor costs about 3x more (a 14 kB record: ~1 ms against ~3)."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.dtype in _NUMPY and not obj.requires_grad:
            try:
                return _tensor, (obj.numpy(),)
            except RuntimeError:  # a tensor NumPy cannot view (conjugate or negative bit): torch's own way
                pass
        return NotImplemented


def _tensor(array: Any) -> torch.Tensor:
    return torch.from_numpy(array)


def dumps(record: dict[str, Any]) -> bytes:
    """A record as bytes (`pickle.loads` reads them back)."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(record)
    return out.getvalue()


def load(data: bytes | None) -> dict[str, Any] | None:
    """A record as `Mirror` copied it (None: none, or unreadable)."""
    if not data:
        return None
    try:
        return pickle.loads(data)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError):
        log.warning("in-place recovery: this rank's copied record is unreadable", exc_info=True)
        return None


def covers(record: dict[str, Any] | None) -> tuple[int, ...]:
    """The steps (newest first) at which `record` holds the rank's own streams and buffers as a step's end
    left them: where the rank can go on exactly with another rank's copy of the (replicated) state."""
    if not record:
        return ()
    return tuple(sorted(set(record.get("afters", {})) & set(record.get("buffers", {})), reverse=True))


class Mirror:
    """Copies the newest record to the store (at `key`, over `client`, a connection of its own) from a
    thread of its own: `send(data)` never waits."""

    def __init__(self, client: Any, key: str):
        self._put: Callable[[bytes], None] = lambda data: client.set(key, data)
        self._data: bytes | None = None
        self._ready = threading.Condition()
        threading.Thread(target=self._run, name="launcher-inplace-mirror", daemon=True).start()

    def send(self, data: bytes) -> None:
        with self._ready:
            self._data = data
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while self._data is None:
                    self._ready.wait()
                data, self._data = self._data, None
            try:
                self._put(data)
            except Exception:  # the store went away (the job ends, or its node was lost): nothing to copy to
                log.debug("in-place recovery: the record's copy stopped", exc_info=True)
                return
