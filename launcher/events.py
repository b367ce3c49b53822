"""The JSON-lines event log (`--events_file`): one object per line, flushed as it happens."""

from __future__ import annotations

import json
import os
import threading
import time


class EventsFile:
    """Appends `{"time": epoch, "event": kind, ...}` lines; a failing disk never stops the job."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def __call__(self, kind: str, fields: dict) -> None:
        line = json.dumps({"time": round(time.time(), 6), "event": kind, **fields}, default=str)
        with self._lock:
            try:
                self._file.write(line + "\n")
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError:  # the last flush failed (disk full): nothing more to do
                pass
