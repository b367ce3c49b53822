"""The JSON-lines event log (`--events_file`): one object per line, written as it happens."""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time

log = logging.getLogger(__name__)


class EventsFile:
    """Appends `{"time": epoch, "event": kind, ...}` lines; a failing disk never stops the job, but it
    is said: once when writing starts to fail, and how many events were lost when it ends."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        # Unbuffered appends: a full disk shows at the write that fails (a buffered file would
        # fail at some later flush, or only at close, and lose every line buffered meanwhile).
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._lock = threading.Lock()
        self.lost = 0  # events not written since writing last failed

    def __call__(self, kind: str, fields: dict) -> None:
        line = (json.dumps({"time": round(time.time(), 6), "event": kind, **fields}, default=str) + "\n").encode()
        with self._lock:
            if self._fd < 0:
                return
            try:
                if os.write(self._fd, line) != len(line):
                    os.write(self._fd, b"\n")  # end the torn line, so the next one parses
                    raise OSError(errno.ENOSPC, "the disk filled up mid-line")
            except OSError as e:
                if self.lost == 0:
                    log.warning(
                        "events file %s: cannot write (%s); events are lost until it can", self.path, e.strerror
                    )
                self.lost += 1
                return
            if self.lost:
                log.warning("events file %s: writing again; %d event(s) were lost", self.path, self.lost)
                self.lost = 0

    def close(self) -> None:
        with self._lock:
            if self._fd < 0:
                return
            if self.lost:
                log.warning(
                    "events file %s: the last %d event(s) were lost (the disk refused them)", self.path, self.lost
                )
            os.close(self._fd)
            self._fd = -1
