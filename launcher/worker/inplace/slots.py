"""Each rank's own state in the node's memory, where its replacement finds it: its random streams at
the start of each step and after each commit, and at the start of the epoch's loader (the agent owns
the folder, in /dev/shm, and removes it when the job ends: keys.SLOTS_VAR).

A rank's streams are its own (a script may seed them per rank); the survivors cannot send what only
the lost rank drew. The record is small (~10 kB) and written twice a step, so it is a file written in
place rather than through the store: two halves written in turn, then a header naming the newer, so
that a rank killed mid-write leaves the previous record whole.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import struct
from typing import Any

log = logging.getLogger(__name__)

HEADER = struct.Struct("<QQ32s")  # sequence number, length, sha256 of the record the sequence names
HALF = 1 << 16  # bytes per half at first; a bigger record grows the file


class Slot:
    """Rank `rank`'s record in `folder` (None: no folder, nothing kept)."""

    def __init__(self, folder: str | None, rank: int):
        self.path = os.path.join(folder, f"rank{rank}") if folder else None
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

    def write(self, record: dict[str, Any]) -> None:
        """Replace the record (the other half first, then the header)."""
        if self.path is None:
            return
        data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
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
